//! Pre-tokenization for byte-level BPE: splitting text into words the way llama.cpp's
//! `unicode_regex_split` does for each `tokenizer.ggml.pre` type.
//!
//! llama.cpp runs a list of regexes in sequence, each one re-splitting the pieces left by
//! the previous one. The common regexes (GPT-2, Llama 3, Qwen2, Qwen3.5, newline runs) have
//! hand-written implementations there, mirrored in [`crate::split_custom`] and chosen by the
//! same exact-string comparison. Every other regex goes through `std::regex` on a
//! "collapsed" text in which each non-ASCII codepoint becomes one byte standing for its
//! category (and `\p{L}` etc. in the regex become a class of that byte plus the ASCII
//! members). We apply the same collapse and run the result with `fancy-regex` (both are
//! leftmost-first backtracking engines), so quirks such as "a non-ASCII letter is neither
//! `a-z` nor `A-Z`" come out identical.

use crate::error::TokenizerError;
use crate::pretok_table::{regex_exprs, unsupported_reason, PreKind};
use crate::split_custom;
use crate::unicode::{self, Flags};

const RE_GPT2: &str = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const RE_LLAMA3_A: &str =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const RE_LLAMA3_B: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const RE_QWEN2: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const RE_QWEN35: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const RE_NEWLINES: &str = "[^\\n]+|[\\n]+";

/// The unicode categories llama.cpp's collapse understands, with their flag.
const UCATS: [(&str, u16); 10] = [
    ("\\p{N}", Flags::NUMBER),
    ("\\p{L}", Flags::LETTER),
    ("\\p{P}", Flags::PUNCTUATION),
    ("\\p{M}", Flags::MARK),
    ("\\p{S}", Flags::SYMBOL),
    ("\\p{Lu}", Flags::LETTER),
    ("\\p{Ll}", Flags::LETTER),
    ("\\p{Lt}", Flags::LETTER),
    ("\\p{Lm}", Flags::LETTER),
    ("\\p{Lo}", Flags::LETTER),
];

/// The stand-in codepoint for a collapsed category (llama.cpp uses the bytes 0xD1..0xD5;
/// we use the codepoints with the same values).
fn ucat_char(flag: u16) -> Option<char> {
    Some(match flag {
        Flags::NUMBER => '\u{D1}',
        Flags::LETTER => '\u{D2}',
        Flags::PUNCTUATION => '\u{D3}',
        Flags::MARK => '\u{D4}',
        Flags::SYMBOL => '\u{D5}',
        _ => return None,
    })
}

/// The ASCII members of each category, in regex class syntax (llama.cpp's `k_ucat_map`).
fn ucat_ascii(flag: u16) -> &'static str {
    match flag {
        Flags::NUMBER => "0-9",
        Flags::LETTER => "A-Za-z",
        Flags::PUNCTUATION => r"!-#%-*,-/:-;?-@\[-\]_\{\}",
        Flags::SYMBOL => r"\$\+<->\^`\|\~",
        _ => "",
    }
}

fn uses_ucat(re: &str) -> bool {
    UCATS.iter().any(|(p, _)| re.contains(p))
}

/// llama.cpp's regex collapse: `\p{X}` becomes `[<stand-in><ascii members>]` (without the
/// brackets when already inside a class). Byte-for-byte the same walk, including its
/// simplistic bracket tracking.
fn collapse_regex(re: &str) -> String {
    let b = re.as_bytes();
    let mut out = String::with_capacity(re.len() + 32);
    let mut inside = false;
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'[' && (i == 0 || b[i - 1] != b'\\') {
            out.push('[');
            inside = true;
            i += 1;
            continue;
        }
        if inside && i > 0 && b[i] == b']' && b[i - 1] != b'\\' {
            out.push(']');
            inside = false;
            i += 1;
            continue;
        }
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1] == b'p' && b[i + 2] == b'{' {
            if let Some(rel) = re[i + 3..].find('}') {
                let close = i + 3 + rel;
                if close <= i + 10 {
                    let pat = &re[i..=close];
                    if let Some(&(_, flag)) = UCATS.iter().find(|(p, _)| *p == pat) {
                        if !inside {
                            out.push('[');
                        }
                        out.push(ucat_char(flag).unwrap_or('\u{D0}'));
                        out.push_str(ucat_ascii(flag));
                        if !inside {
                            out.push(']');
                        }
                        i = close + 1;
                        continue;
                    }
                }
            }
        }
        // the regex is ASCII here (checked by the caller), so bytes are chars
        out.push(b[i] as char);
        i += 1;
    }
    out
}

/// Translates the few spots where `std::regex` (ECMAScript, C locale) and Rust regex syntax
/// differ for the regexes llama.cpp uses: `\d` is ASCII-only there.
fn ecmascript_to_rust(re: &str) -> String {
    re.replace("\\d", "[0-9]")
}

enum Step {
    Gpt2,
    Llama3,
    Qwen2,
    Qwen35,
    Newlines,
    Regex { re: fancy_regex::Regex, collapsed: bool },
}

/// A compiled pre-tokenizer: the ordered splitting steps of one pre-tokenizer type.
pub(crate) struct PreTokenizer {
    steps: Vec<Step>,
}

impl std::fmt::Debug for PreTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PreTokenizer({} steps)", self.steps.len())
    }
}

impl PreTokenizer {
    pub(crate) fn new(kind: PreKind) -> Result<Self, TokenizerError> {
        if let Some(why) = unsupported_reason(kind) {
            return Err(TokenizerError::Unsupported(format!("pre-tokenizer {kind:?}: {why}")));
        }
        let mut steps = Vec::new();
        for &expr in regex_exprs(kind) {
            let step = match expr {
                RE_GPT2 => Step::Gpt2,
                RE_LLAMA3_A | RE_LLAMA3_B => Step::Llama3,
                RE_QWEN2 => Step::Qwen2,
                RE_QWEN35 => Step::Qwen35,
                RE_NEWLINES => Step::Newlines,
                _ => {
                    let collapsed = uses_ucat(expr);
                    if collapsed && !expr.is_ascii() {
                        // llama.cpp rejects this combination too
                        return Err(TokenizerError::Unsupported(format!(
                            "pre-tokenizer {kind:?}: regex mixes unicode categories and non-ASCII characters"
                        )));
                    }
                    let src = if collapsed { collapse_regex(expr) } else { expr.to_string() };
                    let src = ecmascript_to_rust(&src);
                    let re = fancy_regex::Regex::new(&src).map_err(|e| TokenizerError::Regex(format!("{kind:?}: {expr:?}: {e}")))?;
                    Step::Regex { re, collapsed }
                }
            };
            steps.push(step);
        }
        Ok(PreTokenizer { steps })
    }

    /// Splits `text` into words (contiguous, covering all of `text`, never empty).
    pub(crate) fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        if text.is_empty() {
            return Vec::new();
        }
        let cpts: Vec<char> = text.chars().collect();
        let flags: Vec<Flags> = cpts.iter().map(|&c| unicode::flags(c)).collect();
        let mut offsets = vec![cpts.len()];
        for step in &self.steps {
            let next = match step {
                Step::Gpt2 => split_custom::gpt2(&cpts, &flags, &offsets),
                Step::Llama3 => split_custom::llama3(&cpts, &flags, &offsets),
                Step::Qwen2 => split_custom::qwen2(&cpts, &flags, &offsets),
                Step::Qwen35 => split_custom::qwen35(&cpts, &flags, &offsets),
                Step::Newlines => split_custom::newlines(&cpts, &offsets),
                Step::Regex { re, collapsed } => split_regex(re, *collapsed, &cpts, &flags, &offsets),
            };
            offsets = next;
        }
        // codepoint lengths -> byte slices
        let mut words = Vec::with_capacity(offsets.len());
        let mut byte_pos = 0usize;
        let mut cpt_pos = 0usize;
        for len in offsets {
            if len == 0 {
                continue;
            }
            let start = byte_pos;
            for c in &cpts[cpt_pos..cpt_pos + len] {
                byte_pos += c.len_utf8();
            }
            cpt_pos += len;
            words.push(&text[start..byte_pos]);
        }
        words
    }
}

/// The `std::regex` path of `unicode_regex_split`: within each current piece, matches and the
/// gaps between them become new pieces.
fn split_regex(re: &fancy_regex::Regex, collapsed: bool, cpts: &[char], flags: &[Flags], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0usize;
    let mut hay = String::new();
    let mut char_at_byte: Vec<usize> = Vec::new();
    for &offset in offsets {
        let seg = start..start + offset;
        start += offset;
        hay.clear();
        char_at_byte.clear();
        for (i, &c) in cpts[seg.clone()].iter().enumerate() {
            let f = flags[seg.start + i];
            let t = if (c as u32) < 0x80 {
                c
            } else if f.is_whitespace() {
                '\u{0B}'
            } else if collapsed {
                ucat_char(f.category()).unwrap_or('\u{D0}')
            } else {
                c
            };
            for _ in 0..t.len_utf8() {
                char_at_byte.push(i);
            }
            hay.push(t);
        }
        char_at_byte.push(offset);
        let mut last = 0usize; // in codepoints, relative to the segment
        for m in re.find_iter(&hay) {
            let Ok(m) = m else {
                // backtracking limit hit: keep the rest of the segment as one piece
                break;
            };
            let (ms, me) = (char_at_byte[m.start()], char_at_byte[m.end()]);
            if ms > last {
                out.push(ms - last);
            }
            if me > ms {
                out.push(me - ms);
            }
            last = me;
        }
        if last < offset {
            out.push(offset - last);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pretok_table::PreKind::*;

    #[test]
    fn every_supported_kind_compiles() {
        let text = "Hello, wörld!  It's 12345 ünïcode\t\n\n  中文 🤖 ÀÉ x\u{3000}y";
        for &k in PreKind::ALL {
            if unsupported_reason(k).is_some() {
                continue;
            }
            let p = PreTokenizer::new(k).unwrap_or_else(|e| panic!("{k:?}: {e}"));
            let words = p.split(text);
            assert_eq!(words.concat(), text, "{k:?}");
        }
        for k in [KimiK2, Afmoe, TinyAya, Gemma4, SarvamMoe, Whitespace] {
            assert!(PreTokenizer::new(k).is_err());
        }
    }

    #[test]
    fn collapse_matches_llama_cpp() {
        assert_eq!(collapse_regex("\\p{N}"), "[\u{D1}0-9]");
        assert_eq!(collapse_regex("[^\\s\\p{L}]"), "[^\\s\u{D2}A-Za-z]");
    }

    #[test]
    fn smollm_splits_digits_and_words() {
        let p = PreTokenizer::new(Smollm).unwrap();
        assert_eq!(p.split("Numbers: 123 ab  cd"), vec!["Numbers", ":", " ", "1", "2", "3", " ab", " ", " cd"]);
    }

    #[test]
    fn default_splits() {
        let p = PreTokenizer::new(Default).unwrap();
        assert_eq!(p.split("a+b=12345!"), vec!["a", "+", "b", "=", "123", "45", "!"]);
    }
}
