//! Special-token partitioning, llama.cpp's `tokenizer_st_partition`: before the text is
//! tokenized, occurrences of control / user-defined / unknown token texts are cut out and
//! become those tokens directly.
//!
//! Tokens are tried longest text first; for each one, every remaining text fragment is
//! searched left to right and split around the matches. A token with the LSTRIP (RSTRIP)
//! attribute swallows the ASCII whitespace before (after) it. With `parse_special = false`
//! control and unknown tokens are skipped, but user-defined tokens are still split out.
//!
//! The search order is llama.cpp's; to keep it cheap with vocabularies of thousands of
//! special tokens (Gemma has ~6400), an Aho-Corasick pass first finds which special tokens
//! occur in the text at all, and only those are processed.

use aho_corasick::AhoCorasick;

use crate::vocab::{TokenAttr, Vocab};

/// A piece of the input after partitioning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// Raw text: a byte range of the input, to be tokenized.
    Text(usize, usize),
    /// A special token cut out of the text.
    Token(u32),
}

pub(crate) struct SpecialMatcher {
    /// Special token ids in partition order (longest text first).
    order: Vec<u32>,
    /// Automaton over the texts of `order` (pattern i = order[i]).
    ac: Option<AhoCorasick>,
}

impl std::fmt::Debug for SpecialMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SpecialMatcher({} tokens)", self.order.len())
    }
}

/// C `isspace` in the C locale.
#[inline]
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

impl SpecialMatcher {
    pub(crate) fn new(vocab: &Vocab) -> SpecialMatcher {
        let order = vocab.special_tokens.clone();
        let ac = if order.is_empty() { None } else { AhoCorasick::new(order.iter().map(|&id| vocab.tokens[id as usize].as_bytes())).ok() };
        SpecialMatcher { order, ac }
    }

    /// Splits `text` into fragments.
    pub(crate) fn partition(&self, vocab: &Vocab, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Fragment::Text(0, text.len()));
        let Some(ac) = &self.ac else {
            return frags;
        };
        // which special tokens occur anywhere in the text (fragments are substrings of it)
        let mut present = vec![false; self.order.len()];
        let mut any = false;
        for m in ac.find_overlapping_iter(text.as_bytes()) {
            present[m.pattern().as_usize()] = true;
            any = true;
        }
        if !any {
            return frags;
        }
        let bytes = text.as_bytes();
        for (k, &id) in self.order.iter().enumerate() {
            if !present[k] {
                continue;
            }
            let attr = vocab.attr(id);
            if !parse_special && attr.has(TokenAttr::CONTROL | TokenAttr::UNKNOWN) {
                continue;
            }
            let pat = vocab.tokens[id as usize].as_bytes();
            let finder = memchr::memmem::Finder::new(pat);
            let mut next = Vec::with_capacity(frags.len() + 4);
            for &frag in &frags {
                let Fragment::Text(mut base, end) = frag else {
                    next.push(frag);
                    continue;
                };
                loop {
                    let Some(rel) = finder.find(&bytes[base..end]) else {
                        if base < end {
                            next.push(Fragment::Text(base, end));
                        }
                        break;
                    };
                    let m = base + rel;
                    if m > base {
                        let mut left_end = m;
                        if attr.has(TokenAttr::LSTRIP) {
                            while left_end > base && is_c_space(bytes[left_end - 1]) {
                                left_end -= 1;
                            }
                        }
                        if left_end > base {
                            next.push(Fragment::Text(base, left_end));
                        }
                    }
                    next.push(Fragment::Token(id));
                    let after = m + pat.len();
                    if after >= end {
                        break;
                    }
                    base = after;
                    if attr.has(TokenAttr::RSTRIP) {
                        while base < end && is_c_space(bytes[base]) {
                            base += 1;
                        }
                    }
                }
            }
            frags = next;
        }
        frags
    }
}
