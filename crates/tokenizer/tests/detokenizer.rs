//! Streaming detokenization: one id at a time, never broken UTF-8, same text as decode().

mod common;

use common::{load, GEMMA3, SMOLLM2};
use quarrel_tokenizer::{DecodeOptions, Detokenizer, Tokenizer};

const TEXTS: &[&str] = &[
    "Emoji 🤖🚀👍🏽 and 👨‍👩‍👧 family, flags 🇺🇸🇯🇵",
    "中文分词测试，日本語のテキスト、한국어 텍스트",
    "Mixed: café — “quotes” … ∑∫√ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \u{1F9EC}\u{1FAE9}",
    "Привет, мир! مرحبا بالعالم नमस्ते",
];

fn stream(tok: &Tokenizer, ids: &[u32], mut d: Detokenizer) -> (String, usize) {
    let mut out = String::new();
    let mut held = 0;
    for &id in ids {
        match d.push(tok, id) {
            Some(chunk) => {
                assert!(!chunk.is_empty());
                // a String is valid UTF-8 by construction; also check nothing was replaced
                assert!(!chunk.contains('\u{FFFD}'), "replacement char in {chunk:?}");
                out.push_str(&chunk);
            }
            None => held += 1,
        }
    }
    out.push_str(&d.flush());
    assert!(!d.has_pending());
    (out, held)
}

fn check(tok: &Tokenizer) {
    let mut total_held = 0;
    for text in TEXTS {
        let ids = tok.encode(text, false, false);
        let (streamed, held) = stream(tok, &ids, tok.detokenizer());
        assert_eq!(streamed, tok.decode(&ids));
        assert_eq!(streamed, *text);
        total_held += held;
        // with BOS in front (hidden) nothing changes
        let ids = tok.encode(text, true, false);
        assert_eq!(stream(tok, &ids, Detokenizer::new()).0, tok.decode(&ids));
    }
    // the emoji / CJK texts do split characters across tokens somewhere
    assert!(total_held > 0, "no multi-byte character was split across tokens");
}

#[test]
fn smollm2_streaming() {
    if let Some(tok) = load(SMOLLM2) {
        check(&tok);
    }
}

#[test]
fn gemma3_streaming() {
    if let Some(tok) = load(GEMMA3) {
        check(&tok);
    }
}

#[test]
fn special_tokens_rendered_on_request() {
    let Some(tok) = load(SMOLLM2) else { return };
    let ids = tok.encode("<|im_start|>user\nhi<|im_end|>", false, true);
    assert_eq!(ids[0], 1);
    assert_eq!(tok.decode(&ids), "user\nhi");
    let opts = DecodeOptions { render_special: true, ..DecodeOptions::default() };
    assert_eq!(tok.decode_with(&ids, opts), "<|im_start|>user\nhi<|im_end|>");
    assert_eq!(stream(&tok, &ids, Detokenizer::new().render_special(true)).0, "<|im_start|>user\nhi<|im_end|>");
    assert_eq!(tok.token_to_piece(1, false), b"");
    assert_eq!(tok.token_to_piece(1, true), b"<|im_start|>");
    assert_eq!(tok.token_to_piece(u32::MAX, true), b"");
}

#[test]
fn broken_utf8_is_replaced_not_stalled() {
    let Some(tok) = load(GEMMA3) else { return };
    // <0xF0> <0x41>: a 4-byte lead followed by ASCII can never complete
    let (f0, a) = (tok.token_id("<0xF0>").unwrap(), tok.token_id("<0x41>").unwrap());
    let mut d = Detokenizer::new();
    assert_eq!(d.push(&tok, f0), None);
    assert_eq!(d.push(&tok, a).as_deref(), Some("\u{FFFD}A"));
    assert_eq!(d.push(&tok, f0), None);
    assert_eq!(d.flush(), "\u{FFFD}");
    assert_eq!(tok.decode(&[f0, a, f0]), "\u{FFFD}A\u{FFFD}");
}
