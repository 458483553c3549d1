//! WordPiece (`tokenizer.ggml.model = "bert"`: BERT, MiniLM, bge, e5, gte, nomic-embed), as
//! llama.cpp's `llm_tokenizer_wpm` runs it. The text is cut into words (whitespace ends a word;
//! punctuation, ASCII symbols and CJK ideographs are words of their own), lower-cased and
//! stripped of accents as the normalizer options say (accents: the first codepoint of each
//! character's canonical decomposition, combining marks dropped), and each word, prefixed with
//! "▁" (the converter's mark of a word start; `##` continuations are stored without it), is
//! covered greedily by the longest vocabulary entries from its start. A word that cannot be
//! covered is one unknown token.

use crate::unicode::flags;
use crate::vocab::Vocab;
use unicode_normalization::UnicodeNormalization;

/// BertNormalizer's options (`tokenizer.ggml.normalizer.*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Normalizer {
    pub lowercase: bool,
    pub strip_accents: bool,
}

/// The words of `text`, normalized.
pub(crate) fn words(text: &str, norm: Normalizer) -> Vec<String> {
    let mut words = vec![String::new()];
    for c in text.chars() {
        let c = if norm.strip_accents { std::iter::once(c).nfd().next().unwrap_or(c) } else { c };
        let cp = c as u32;
        let f = flags(c);
        if f.is_whitespace() {
            if !words.last().is_some_and(String::is_empty) {
                words.push(String::new());
            }
            continue;
        }
        if cp == 0 || cp == 0xFFFD || f.is_control() || (norm.strip_accents && f.is_mark()) {
            continue;
        }
        let c = if norm.lowercase { c.to_lowercase().next().unwrap_or(c) } else { c };
        let last = words.last_mut().expect("never empty");
        if f.is_punctuation() || (cp < 0x7F && f.is_symbol()) || is_chinese(cp) {
            if !last.is_empty() {
                words.push(String::new());
            }
            words.last_mut().expect("never empty").push(c);
            words.push(String::new());
        } else {
            last.push(c);
        }
    }
    words.retain(|w| !w.is_empty());
    words
}

/// CJK ideographs, as BERT's tokenizer (and Hugging Face's) delimits them.
fn is_chinese(cp: u32) -> bool {
    matches!(cp,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F | 0x2B740..=0x2B81F
        // 0x2B920, not 0x2B820: Hugging Face's value, which llama.cpp follows
        | 0x2B920..=0x2CEAF | 0xF900..=0xFAFF | 0x2F800..=0x2FA1F)
}

/// Tokenize `text` (a fragment between special tokens) into `out`.
pub(crate) fn encode(v: &Vocab, norm: Normalizer, max_len: usize, text: &str, out: &mut Vec<u32>) {
    for word in words(text, norm) {
        let w = format!("\u{2581}{word}");
        let b = w.as_bytes();
        let start = out.len();
        let mut i = 0;
        while i < b.len() {
            // the longest entry from byte i (entries are whole characters: other cuts miss)
            let found = (i + 1..=(i + max_len).min(b.len()))
                .rev()
                .find_map(|j| std::str::from_utf8(&b[i..j]).ok().and_then(|s| v.token_to_id.get(s)).map(|&id| (id, j)));
            match found {
                Some((id, j)) => {
                    out.push(id);
                    i = j;
                }
                None => {
                    out.truncate(start);
                    break;
                }
            }
        }
        if out.len() == start {
            out.extend(v.ids.unk);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_normalize_and_strip() {
        let n = Normalizer { lowercase: true, strip_accents: true };
        assert_eq!(words("Hello, World!  Café\u{0301}s 北京x", n), ["hello", ",", "world", "!", "cafes", "北", "京", "x"]);
        let keep = Normalizer { lowercase: false, strip_accents: false };
        assert_eq!(words("Café x$y", keep), ["Café", "x", "$", "y"]);
        assert!(words(" \t\n", n).is_empty());
    }
}
