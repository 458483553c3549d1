//! `cargo fuzz run tokenize`: any text through small byte-level BPE vocabularies under every
//! pre-tokenizer family, and a SentencePiece one with byte fallback: encoding (with and
//! without special-token parsing) never panics, and decoding gives the text back.
#![no_main]
use quarrel_gguf::{Gguf, GgufWriter, Value, ValueType};
use quarrel_tokenizer::{DecodeOptions, Tokenizer};
use std::sync::OnceLock;

/// One name per pre-tokenizer family the tokenizer implements.
const PRE: [&str; 12] = [
    "default",
    "llama-bpe",
    "gpt-2",
    "qwen2",
    "smollm",
    "deepseek-llm",
    "deepseek-coder",
    "falcon",
    "starcoder",
    "refact",
    "command-r",
    "gpt-4o",
];

fn strings<S: AsRef<str>>(v: &[S]) -> Value {
    Value::Array(ValueType::String, v.iter().map(|s| Value::String(s.as_ref().to_string())).collect())
}

fn load(kv: Vec<(&str, Value)>) -> Tokenizer {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()));
    for (k, v) in kv {
        w.set(k, v);
    }
    Tokenizer::from_gguf(&Gguf::from_bytes(w.to_bytes(&[]).unwrap()).unwrap()).unwrap()
}

/// GPT-2's byte -> char map.
fn byte_char(b: u8) -> char {
    let printable = |c: u32| (0x21..=0x7E).contains(&c) || (0xA1..=0xAC).contains(&c) || (0xAE..=0xFF).contains(&c);
    if printable(b as u32) {
        return char::from_u32(b as u32).unwrap();
    }
    char::from_u32(256 + (0..b as u32).filter(|&c| !printable(c)).count() as u32).unwrap()
}

fn bpe(pre: &str) -> Tokenizer {
    let mut toks: Vec<String> = vec!["<|endoftext|>".into(), "<|im_start|>".into(), "<|im_end|>".into()];
    toks.extend((0..=255u8).map(|b| byte_char(b).to_string()));
    toks.extend(["Ġt", "he", "Ġthe", "in", "Ġa", "er", "Ġ1", "12"].iter().map(|s| s.to_string()));
    let types: Vec<Value> = (0..toks.len()).map(|i| Value::I32(if i < 3 { 3 } else { 1 })).collect();
    load(vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String(pre.into())),
        ("tokenizer.ggml.tokens", strings(&toks)),
        ("tokenizer.ggml.token_type", Value::Array(ValueType::I32, types)),
        ("tokenizer.ggml.merges", strings(&["h e", "Ġ t", "Ġt he", "i n", "Ġ a", "e r", "Ġ 1", "1 2"])),
        ("tokenizer.ggml.eos_token_id", Value::U32(0)),
    ])
}

fn spm() -> Tokenizer {
    let mut toks: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    toks.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    let words = [("▁", -1.0f32), ("a", -2.0), ("b", -2.0), ("▁a", -3.0), ("ab", -0.5), ("▁ab", -0.1)];
    toks.extend(words.iter().map(|(w, _)| w.to_string()));
    let mut scores = vec![Value::F32(0.0); 3 + 256];
    scores.extend(words.iter().map(|(_, s)| Value::F32(*s)));
    let mut types = vec![Value::I32(2), Value::I32(3), Value::I32(3)];
    types.extend((0..256).map(|_| Value::I32(6)));
    types.extend(words.iter().map(|_| Value::I32(1)));
    load(vec![
        ("tokenizer.ggml.model", Value::String("llama".into())),
        ("tokenizer.ggml.tokens", strings(&toks)),
        ("tokenizer.ggml.scores", Value::Array(ValueType::F32, scores)),
        ("tokenizer.ggml.token_type", Value::Array(ValueType::I32, types)),
    ])
}

/// (pre-tokenizer name, tokenizer, byte-level)
fn tokenizers() -> &'static [(&'static str, Tokenizer, bool)] {
    static T: OnceLock<Vec<(&'static str, Tokenizer, bool)>> = OnceLock::new();
    T.get_or_init(|| PRE.iter().map(|&p| (p, bpe(p), true)).chain([("spm", spm(), false)]).collect())
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    for (pre, tok, byte_level) in tokenizers() {
        let _ = tok.encode(text, true, true);
        let ids = tok.encode(text, false, false);
        // without llama.cpp's clean-up of spaces before punctuation, which some families ask for
        let back = tok.decode_with(&ids, DecodeOptions { clean_spaces: false, ..Default::default() });
        // byte-level BPE keeps every byte; SPM adds its leading space marker back as a space
        if *byte_level {
            assert_eq!(back, text, "round trip with pre-tokenizer {pre}");
        }
    }
});
