//! Special-token partitioning, llama.cpp's `tokenizer_st_partition`: before the text is
//! tokenized, occurrences of control / user-defined / unknown token texts are cut out and
//! become those tokens directly.
//!
//! Tokens are tried longest text first; for each one, every remaining text fragment is
//! searched left to right and split around the matches. A token with the LSTRIP (RSTRIP)
//! attribute swallows the ASCII whitespace before (after) it. With `parse_special = false`
//! control and unknown tokens are skipped, but user-defined tokens are still split out; the
//! same holds inside "plain" ranges of an otherwise parsed text (chat message content).
//!
//! The search order is llama.cpp's; to keep it cheap with vocabularies of thousands of
//! special tokens (Gemma has ~6400), an Aho-Corasick pass first finds which special tokens
//! occur in the text at all, and only those are processed.

use aho_corasick::AhoCorasick;
use std::ops::Range;

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

    /// Splits `text` into fragments. Inside the byte ranges `plain` (sorted, disjoint) control
    /// and unknown tokens are not cut out: that text stays text, as with `parse_special =
    /// false` for the whole input. Text fragments that end up side by side are joined again,
    /// so marking a range plain changes nothing unless a control token's text is inside it.
    pub(crate) fn partition(&self, vocab: &Vocab, text: &str, plain: &[Range<usize>]) -> Vec<Fragment> {
        if text.is_empty() {
            return vec![];
        }
        // (fragment, inside a plain range)
        let mut frags: Vec<(Fragment, bool)> = Vec::new();
        let mut pos = 0;
        for r in plain {
            let (a, b) = (r.start.clamp(pos, text.len()), r.end.clamp(pos, text.len()));
            if a > pos {
                frags.push((Fragment::Text(pos, a), false));
            }
            if b > a {
                frags.push((Fragment::Text(a, b), true));
            }
            pos = pos.max(b);
        }
        if pos < text.len() {
            frags.push((Fragment::Text(pos, text.len()), false));
        }
        let Some(ac) = &self.ac else {
            return joined(frags);
        };
        // which special tokens occur anywhere in the text (fragments are substrings of it)
        let mut present = vec![false; self.order.len()];
        let mut any = false;
        for m in ac.find_overlapping_iter(text.as_bytes()) {
            present[m.pattern().as_usize()] = true;
            any = true;
        }
        if !any {
            return joined(frags);
        }
        let bytes = text.as_bytes();
        for (k, &id) in self.order.iter().enumerate() {
            if !present[k] {
                continue;
            }
            let attr = vocab.attr(id);
            let control = attr.has(TokenAttr::CONTROL | TokenAttr::UNKNOWN);
            let pat = vocab.tokens[id as usize].as_bytes();
            let finder = memchr::memmem::Finder::new(pat);
            let mut next = Vec::with_capacity(frags.len() + 4);
            for &(frag, is_plain) in &frags {
                let Fragment::Text(mut base, end) = frag else {
                    next.push((frag, is_plain));
                    continue;
                };
                if is_plain && control {
                    next.push((frag, is_plain));
                    continue;
                }
                loop {
                    let Some(rel) = finder.find(&bytes[base..end]) else {
                        if base < end {
                            next.push((Fragment::Text(base, end), is_plain));
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
                            next.push((Fragment::Text(base, left_end), is_plain));
                        }
                    }
                    next.push((Fragment::Token(id), false));
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
        joined(frags)
    }
}

/// The fragments with neighbouring text ranges joined (plain marks dropped).
fn joined(frags: Vec<(Fragment, bool)>) -> Vec<Fragment> {
    let mut out: Vec<Fragment> = Vec::with_capacity(frags.len());
    for (f, _) in frags {
        match (out.last_mut(), f) {
            (Some(Fragment::Text(_, e)), Fragment::Text(a, b)) if *e == a => *e = b,
            _ => out.push(f),
        }
    }
    out
}
