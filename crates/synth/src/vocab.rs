//! Tokenizer metadata for synthetic models: either a synthetic SentencePiece ("llama")
//! vocabulary of exactly `n_vocab` tokens, or every `tokenizer.*` key of a real model.
//!
//! What llama.cpp's `llama_vocab::impl::load` (src/llama-vocab.cpp) needs from an SPM
//! vocabulary, and how the synthetic one meets it:
//! * `tokenizer.ggml.model = "llama"` selects SPM (defaults: unk 0, bos 1, eos 2, add_bos);
//! * `tokenizer.ggml.tokens` is an array of strings, all distinct (it asserts
//!   `id_to_token.size() == token_to_id.size()`) and non-empty;
//! * `tokenizer.ggml.scores` (f32) and `tokenizer.ggml.token_type` (i32) are optional but, when
//!   present, at least as long as the token list;
//! * byte tokens `<0x00>`..`<0xFF>` (type BYTE) give byte fallback and the newline token
//!   (`byte_to_token('\n')` looks up `<0x0A>`);
//! * special ids must be `< n_tokens`.
//!
//! The model's `token_embd` rows must equal the token count, so `--vocab-from` overrides
//! the preset's `n_vocab`.

use crate::SynthError;
use quarrel_gguf::{Gguf, GgufError, Value, ValueType};
use std::collections::HashSet;
use std::path::Path;

/// llama.cpp's `llama_token_type` values.
pub const TOKEN_TYPE_NORMAL: i32 = 1;
pub const TOKEN_TYPE_UNKNOWN: i32 = 2;
pub const TOKEN_TYPE_CONTROL: i32 = 3;
pub const TOKEN_TYPE_BYTE: i32 = 6;

/// Ids of the special tokens of the synthetic vocabulary.
pub const UNK_ID: u32 = 0;
pub const BOS_ID: u32 = 1;
pub const EOS_ID: u32 = 2;
/// Specials plus the 256 byte tokens: the smallest synthetic vocabulary.
pub const MIN_SYNTH_VOCAB: usize = 3 + 256;

/// Tokenizer metadata, ready to be written in this order.
pub struct Vocab {
    pub n_tokens: usize,
    pub kv: Vec<(String, Value)>,
}

/// The normal pieces, best (most frequent, highest score) first: the word-start marker,
/// printable ASCII, word-initial ASCII, lower-case bigrams and trigrams (plain and
/// word-initial), then unique fillers `▁tok<i>`. Prefixes come before their extensions so
/// SPM merges can reach every multi-character piece.
fn pieces(n: usize) -> Vec<String> {
    const WS: &str = "\u{2581}";
    let mut out: Vec<String> = Vec::with_capacity(n);
    let mut seen: HashSet<String> = HashSet::with_capacity(n);
    let mut push = |s: String, out: &mut Vec<String>| {
        if out.len() < n && seen.insert(s.clone()) {
            out.push(s);
        }
    };
    let letters: Vec<char> = ('a'..='z').collect();
    let printable: Vec<char> = (0x21u8..=0x7e).map(char::from).collect();
    push(WS.to_string(), &mut out);
    for c in &letters {
        push(format!("{WS}{c}"), &mut out);
    }
    for c in &printable {
        push(c.to_string(), &mut out);
    }
    for c in &printable {
        push(format!("{WS}{c}"), &mut out);
    }
    for a in &letters {
        for b in &letters {
            push(format!("{a}{b}"), &mut out);
            push(format!("{WS}{a}{b}"), &mut out);
        }
    }
    for a in &letters {
        for b in &letters {
            for c in &letters {
                if out.len() >= n {
                    break;
                }
                push(format!("{a}{b}{c}"), &mut out);
                push(format!("{WS}{a}{b}{c}"), &mut out);
            }
        }
    }
    let mut i = 0usize;
    while out.len() < n {
        push(format!("{WS}tok{i}"), &mut out);
        i += 1;
    }
    out
}

/// A synthetic SPM vocabulary of exactly `n_vocab` tokens (at least [`MIN_SYNTH_VOCAB`]).
pub fn synthetic(n_vocab: usize) -> Result<Vocab, String> {
    if n_vocab < MIN_SYNTH_VOCAB {
        return Err(format!("a synthetic vocabulary needs at least {MIN_SYNTH_VOCAB} tokens, got {n_vocab}"));
    }
    let mut tokens = Vec::with_capacity(n_vocab);
    let mut scores = Vec::with_capacity(n_vocab);
    let mut types = Vec::with_capacity(n_vocab);
    for (t, ty) in [("<unk>", TOKEN_TYPE_UNKNOWN), ("<s>", TOKEN_TYPE_CONTROL), ("</s>", TOKEN_TYPE_CONTROL)] {
        tokens.push(Value::String(t.into()));
        scores.push(Value::F32(0.0));
        types.push(Value::I32(ty));
    }
    for b in 0..=255u8 {
        tokens.push(Value::String(format!("<0x{b:02X}>")));
        scores.push(Value::F32(0.0));
        types.push(Value::I32(TOKEN_TYPE_BYTE));
    }
    for (i, p) in pieces(n_vocab - MIN_SYNTH_VOCAB).into_iter().enumerate() {
        tokens.push(Value::String(p));
        scores.push(Value::F32(-(i as f32)));
        types.push(Value::I32(TOKEN_TYPE_NORMAL));
    }
    debug_assert_eq!(tokens.len(), n_vocab);
    let kv = vec![
        ("tokenizer.ggml.model".to_string(), Value::String("llama".into())),
        ("tokenizer.ggml.pre".to_string(), Value::String("default".into())),
        ("tokenizer.ggml.tokens".to_string(), Value::Array(ValueType::String, tokens)),
        ("tokenizer.ggml.scores".to_string(), Value::Array(ValueType::F32, scores)),
        ("tokenizer.ggml.token_type".to_string(), Value::Array(ValueType::I32, types)),
        ("tokenizer.ggml.bos_token_id".to_string(), Value::U32(BOS_ID)),
        ("tokenizer.ggml.eos_token_id".to_string(), Value::U32(EOS_ID)),
        ("tokenizer.ggml.unknown_token_id".to_string(), Value::U32(UNK_ID)),
        ("tokenizer.ggml.add_bos_token".to_string(), Value::Bool(true)),
        ("tokenizer.ggml.add_eos_token".to_string(), Value::Bool(false)),
    ];
    Ok(Vocab { n_tokens: n_vocab, kv })
}

/// Every `tokenizer.*` key of a GGUF model, in its order; the token count is the length of
/// `tokenizer.ggml.tokens`.
pub fn from_gguf(path: &Path) -> Result<Vocab, GgufError> {
    let g = Gguf::open(path)?;
    let n_tokens = g.get_array("tokenizer.ggml.tokens")?.ok_or_else(|| GgufError::MissingKey("tokenizer.ggml.tokens".into()))?.len();
    let kv = g.metadata().iter().filter(|(k, _)| k.starts_with("tokenizer.")).cloned().collect();
    Ok(Vocab { n_tokens, kv })
}

/// The vocabulary a model is written with: the `tokenizer.*` keys of the GGUF model `from`,
/// else a synthetic one of `n_vocab` tokens.
pub fn load(from: Option<&Path>, n_vocab: usize) -> Result<Vocab, SynthError> {
    match from {
        Some(path) => Ok(from_gguf(path)?),
        None => synthetic(n_vocab).map_err(SynthError::Invalid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_vocab_is_exact_and_unique() {
        for n in [MIN_SYNTH_VOCAB, 512, 32_000, 49_152, 128_256] {
            let v = synthetic(n).unwrap();
            assert_eq!(v.n_tokens, n);
            let toks = v.kv.iter().find(|(k, _)| k == "tokenizer.ggml.tokens").unwrap().1.as_array().unwrap();
            assert_eq!(toks.len(), n);
            let set: HashSet<&str> = toks.iter().map(|t| t.as_str().unwrap()).collect();
            assert_eq!(set.len(), n, "duplicate tokens at n = {n}");
            assert!(set.iter().all(|t| !t.is_empty()));
            assert_eq!(toks[3 + 10].as_str(), Some("<0x0A>"));
        }
        assert!(synthetic(100).is_err());
    }
}
