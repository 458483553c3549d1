//! SentencePiece-style tokenization, llama.cpp's `llm_tokenizer_spm_session`.
//!
//! The fragment (spaces already replaced by U+2581 "▁") is split into UTF-8 characters;
//! adjacent symbols whose concatenation is a vocabulary token are merged, highest token
//! score first (ties: leftmost first), until nothing merges. A final symbol that is not a
//! token (only possible for a single character) is emitted as byte-fallback tokens
//! `<0xNN>` (or the unknown token when the vocabulary has no byte tokens).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::symbols::{merge, Sym};
use crate::vocab::Vocab;

struct Bigram {
    left: u32,
    right: u32,
    score: f32,
    size: u32,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then smaller `left`.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.partial_cmp(&other.score).unwrap_or(Ordering::Equal).then_with(|| other.left.cmp(&self.left))
    }
}

/// Replaces every space with U+2581, optionally prefixing one.
pub(crate) fn escape_whitespace(text: &str, prefix_space: bool) -> String {
    let mut s = String::with_capacity(text.len() + 8);
    if prefix_space {
        s.push('\u{2581}');
    }
    for c in text.chars() {
        s.push(if c == ' ' { '\u{2581}' } else { c });
    }
    s
}

/// Tokenizes already-escaped text and appends the ids.
pub(crate) fn encode_escaped(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    if text.is_empty() {
        return;
    }
    let n = text.chars().count();
    let mut syms: Vec<Sym> = text.char_indices().enumerate().map(|(k, (i, c))| Sym::linked(k, n, i, c.len_utf8(), 0)).collect();
    let mut queue = BinaryHeap::new();
    for i in 1..syms.len() {
        try_add_bigram(vocab, text, &syms, &mut queue, i as i32 - 1, i as i32);
    }
    while let Some(bg) = queue.pop() {
        let Some((prev, next)) = merge(&mut syms, bg.left as usize, bg.right as usize, bg.size) else {
            continue;
        };
        try_add_bigram(vocab, text, &syms, &mut queue, prev, bg.left as i32);
        try_add_bigram(vocab, text, &syms, &mut queue, bg.left as i32, next);
    }
    let mut i = 0i32;
    while i >= 0 {
        let s = syms[i as usize];
        let piece = &text[s.start as usize..(s.start + s.len) as usize];
        if let Some(&id) = vocab.token_to_id.get(piece) {
            out.push(id);
        } else {
            for &b in piece.as_bytes() {
                if let Some(id) = vocab.spm_byte_token(b).or(vocab.ids.unk) {
                    out.push(id);
                }
            }
        }
        i = s.next;
    }
}

#[inline]
fn try_add_bigram(vocab: &Vocab, text: &str, syms: &[Sym], queue: &mut BinaryHeap<Bigram>, left: i32, right: i32) {
    if left < 0 || right < 0 {
        return;
    }
    let (l, r) = (syms[left as usize], syms[right as usize]);
    let piece = &text[l.start as usize..(l.start + l.len + r.len) as usize];
    if let Some(&id) = vocab.token_to_id.get(piece) {
        let score = vocab.scores.get(id as usize).copied().unwrap_or(0.0);
        queue.push(Bigram { left: left as u32, right: right as u32, score, size: l.len + r.len });
    }
}
