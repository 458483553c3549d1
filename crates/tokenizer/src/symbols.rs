//! The symbol chain both merging tokenizers (BPE and SentencePiece) work on: a word's pieces
//! as byte ranges in a doubly linked list, where merging a bigram folds the right symbol into
//! the left one.

/// One symbol of the word being merged.
#[derive(Clone, Copy)]
pub(crate) struct Sym {
    /// Byte offset in the word.
    pub start: u32,
    /// Length in bytes; 0 once merged into its left neighbour.
    pub len: u32,
    /// Index of the live neighbour on each side, -1 at the ends.
    pub prev: i32,
    pub next: i32,
    /// BPE: interned id of the symbol's (byte-encoded) text, or NONE. Unused by SPM.
    pub id: u32,
}

impl Sym {
    /// Symbol `i` of a fresh chain of `n`, linked to its neighbours.
    #[inline]
    pub(crate) fn linked(i: usize, n: usize, start: usize, len: usize, id: u32) -> Sym {
        Sym { start: start as u32, len: len as u32, prev: i as i32 - 1, next: if i + 1 == n { -1 } else { i as i32 + 1 }, id }
    }
}

/// Merge symbol `right` into `left` if the queued bigram is still current (both alive,
/// together still `size` bytes). Returns the merged symbol's neighbours `(prev, next)`,
/// whose bigrams with it are the new candidates, or `None` for an outdated bigram.
#[inline]
pub(crate) fn merge(syms: &mut [Sym], left: usize, right: usize, size: u32) -> Option<(i32, i32)> {
    let (l, r) = (left, right);
    if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != size {
        return None;
    }
    syms[l].len += syms[r].len;
    syms[r].len = 0;
    syms[l].next = syms[r].next;
    let nx = syms[r].next;
    if nx >= 0 {
        syms[nx as usize].prev = left as i32;
    }
    Some((syms[l].prev, syms[l].next))
}
