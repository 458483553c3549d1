//! Hand-written splitters mirroring llama.cpp's `unicode_regex_split_custom_*`: the same
//! scanning logic, so the same words come out (including where those routines deviate
//! slightly from the regex they stand for).
//!
//! Each function takes the codepoints, their flags and the current pieces (lengths in
//! codepoints) and returns the new pieces. Positions outside the current piece read as
//! "no codepoint" (`OUT`, flags 0), which is how lookaheads stop at piece boundaries.

use crate::unicode::Flags;

const OUT: u32 = 0xFFFF_FFFF;

/// One piece being scanned.
struct Seg<'a> {
    cpts: &'a [char],
    flags: &'a [Flags],
    ini: usize,
    end: usize,
    prev_end: usize,
}

impl<'a> Seg<'a> {
    #[inline]
    fn cpt(&self, pos: usize) -> u32 {
        if pos >= self.ini && pos < self.end {
            self.cpts[pos] as u32
        } else {
            OUT
        }
    }
    #[inline]
    fn fl(&self, pos: usize) -> Flags {
        if pos >= self.ini && pos < self.end {
            self.flags[pos]
        } else {
            Flags::OUT
        }
    }
    /// Ends the current word at `end`; returns its length.
    #[inline]
    fn add(&mut self, end: usize, out: &mut Vec<usize>) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            out.push(len);
        }
        self.prev_end = end;
        len
    }
}

#[inline]
fn lower(c: u32) -> u32 {
    if (b'A' as u32..=b'Z' as u32).contains(&c) {
        c + 32
    } else {
        c
    }
}

const R: u32 = b'\r' as u32;
const N: u32 = b'\n' as u32;
const SP: u32 = b' ' as u32;
const APOS: u32 = b'\'' as u32;

/// Run `scan` over each of the current pieces (`offsets`), as a [`Seg`] that pushes the
/// new word lengths into the output.
fn split_pieces(cpts: &[char], flags: &[Flags], offsets: &[usize], mut scan: impl FnMut(&mut Seg<'_>, &mut Vec<usize>)) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &offset in offsets {
        let mut s = Seg { cpts, flags, ini: start, end: start + offset, prev_end: start };
        start += offset;
        scan(&mut s, &mut out);
    }
    out
}

/// The scanners' last alternatives, `\s+(?!\S)|\s+` over the `nws` whitespace codepoints
/// at `pos`, else the single codepoint there: ends that word and returns where it ends.
#[inline]
fn whitespace_or_one(s: &mut Seg, pos: usize, nws: usize, out: &mut Vec<usize>) -> usize {
    let end = if nws > 1 && s.cpt(pos + nws) != OUT {
        pos + nws - 1 // \s+(?!\S): leave the last space to the next word
    } else if nws > 0 {
        pos + nws // \s+
    } else {
        pos + 1
    };
    s.add(end, out);
    end
}

/// `'s|'t|'re|'ve|'m|'ll|'d` (case-insensitive when `fold`); returns the match length.
#[inline]
fn contraction(s: &Seg, pos: usize, fold: bool) -> Option<usize> {
    if s.cpt(pos) != APOS || pos + 1 >= s.end {
        return None;
    }
    let f = |c: u32| if fold { lower(c) } else { c };
    let n1 = f(s.cpt(pos + 1));
    if [b's', b't', b'm', b'd'].iter().any(|&c| c as u32 == n1) {
        return Some(2);
    }
    if pos + 2 < s.end {
        let n2 = f(s.cpt(pos + 2));
        let pair = |a: u8, b: u8| n1 == a as u32 && n2 == b as u32;
        if pair(b'r', b'e') || pair(b'v', b'e') || pair(b'l', b'l') {
            return Some(3);
        }
    }
    None
}

/// [`split_pieces`] with the loop the GPT-2 and Llama-3-like scanners share: at each
/// position a contraction ([`contraction`], case-insensitive when `fold`) is a word of its
/// own; otherwise `step` gets the position, its codepoint and flags, ends what word it
/// matches there and returns where the next one starts.
fn scan_words(
    cpts: &[char],
    flags: &[Flags],
    offsets: &[usize],
    fold: bool,
    mut step: impl FnMut(&mut Seg<'_>, usize, u32, Flags, &mut Vec<usize>) -> usize,
) -> Vec<usize> {
    split_pieces(cpts, flags, offsets, |s, out| {
        let mut pos = s.ini;
        while pos < s.end {
            let cpt = s.cpt(pos);
            let f = s.fl(pos);
            if let Some(len) = contraction(s, pos, fold) {
                pos += s.add(pos + len, out);
                continue;
            }
            pos = step(s, pos, cpt, f, out);
        }
    })
}

/// GPT-2's run classes, each optionally led by one space: letters, digits, and the rest
/// but white space.
const GPT2_RUNS: [fn(Flags) -> bool; 3] =
    [Flags::is_letter, Flags::is_number, |f| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.any()];

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
pub(crate) fn gpt2(cpts: &[char], flags: &[Flags], offsets: &[usize]) -> Vec<usize> {
    scan_words(cpts, flags, offsets, false, |s, mut pos, cpt, f, out| {
        // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: the first class that matches
        let mut f2 = if cpt == SP { s.fl(pos + 1) } else { f };
        if let Some(class) = GPT2_RUNS.iter().find(|class| class(f2)) {
            pos += (cpt == SP) as usize;
            while class(f2) {
                pos += 1;
                f2 = s.fl(pos);
            }
            s.add(pos, out);
            return pos;
        }
        let mut nws = 0;
        while s.fl(pos + nws).is_whitespace() {
            nws += 1;
        }
        whitespace_or_one(s, pos, nws, out)
    })
}

/// Which variant of the Llama-3-like scanner.
#[derive(Clone, Copy, PartialEq)]
enum Variant {
    /// `\p{N}{1,3}`
    Llama3,
    /// `\p{N}`
    Qwen2,
    /// `\p{N}` and letters runs include marks: `[\p{L}\p{M}]+`
    Qwen35,
}

/// Llama 3 / Qwen2 / Qwen3.5:
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
fn llama3_like(cpts: &[char], flags: &[Flags], offsets: &[usize], v: Variant) -> Vec<usize> {
    let marks = v == Variant::Qwen35;
    let wordish = |f: Flags| f.is_letter() || (marks && f.is_mark());
    scan_words(cpts, flags, offsets, true, |s, mut pos, cpt, f, out| {
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !(cpt == R || cpt == N || f.is_number()) && (wordish(f) || wordish(s.fl(pos + 1))) {
            pos += 1;
            while wordish(s.fl(pos)) {
                pos += 1;
            }
            s.add(pos, out);
            return pos;
        }
        // \p{N}{1,3} or \p{N}
        if f.is_number() {
            if v == Variant::Llama3 {
                let mut ini = pos;
                while s.fl(pos).is_number() {
                    pos += 1;
                    if pos - ini >= 3 {
                        s.add(pos, out);
                        ini = pos;
                    }
                }
            } else {
                pos += 1;
            }
            s.add(pos, out);
            return pos;
        }
        // <space>?[^\s\p{L}\p{N}]+[\r\n]*   (llama.cpp tests the first codepoint's flags
        // for "inside the piece", not those of the one after the space)
        let mut f2 = if cpt == SP { s.fl(pos + 1) } else { f };
        let other = |g: Flags| !(g.is_whitespace() || g.is_letter() || g.is_number() || (marks && g.is_mark()));
        if other(f2) && f.any() {
            pos += (cpt == SP) as usize;
            while other(f2) && f2.any() {
                pos += 1;
                f2 = s.fl(pos);
            }
            let mut c2 = s.cpt(pos);
            while c2 == R || c2 == N {
                pos += 1;
                c2 = s.cpt(pos);
            }
            s.add(pos, out);
            return pos;
        }
        let mut nws = 0;
        let mut last_rn = 0;
        while s.fl(pos + nws).is_whitespace() {
            let c2 = s.cpt(pos + nws);
            if c2 == R || c2 == N {
                last_rn = pos + nws + 1;
            }
            nws += 1;
        }
        // \s*[\r\n]+
        if last_rn > 0 {
            pos = last_rn;
            s.add(pos, out);
            return pos;
        }
        whitespace_or_one(s, pos, nws, out)
    })
}

pub(crate) fn llama3(cpts: &[char], flags: &[Flags], offsets: &[usize]) -> Vec<usize> {
    llama3_like(cpts, flags, offsets, Variant::Llama3)
}

pub(crate) fn qwen2(cpts: &[char], flags: &[Flags], offsets: &[usize]) -> Vec<usize> {
    llama3_like(cpts, flags, offsets, Variant::Qwen2)
}

pub(crate) fn qwen35(cpts: &[char], flags: &[Flags], offsets: &[usize]) -> Vec<usize> {
    llama3_like(cpts, flags, offsets, Variant::Qwen35)
}

/// `[^\n]+|[\n]+`: runs of newlines and runs of everything else.
pub(crate) fn newlines(cpts: &[char], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &offset in offsets {
        let end = start + offset;
        let mut pos = start;
        while pos < end {
            let nl = cpts[pos] == '\n';
            let run = pos;
            while pos < end && (cpts[pos] == '\n') == nl {
                pos += 1;
            }
            out.push(pos - run);
        }
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unicode::flags;

    type SplitFn = fn(&[char], &[Flags], &[usize]) -> Vec<usize>;

    fn run(f: SplitFn, text: &str) -> Vec<String> {
        let cpts: Vec<char> = text.chars().collect();
        let fl: Vec<Flags> = cpts.iter().map(|&c| flags(c)).collect();
        let lens = f(&cpts, &fl, &[cpts.len()]);
        let mut out = vec![];
        let mut p = 0;
        for l in lens {
            out.push(cpts[p..p + l].iter().collect());
            p += l;
        }
        out
    }

    #[test]
    fn gpt2_basic() {
        assert_eq!(run(gpt2, "Hello world's  end"), vec!["Hello", " world", "'s", " ", " end"]);
        assert_eq!(run(gpt2, "a   "), vec!["a", "   "]);
        assert_eq!(run(gpt2, "x!? 12"), vec!["x", "!?", " 12"]);
    }

    #[test]
    fn llama3_basic() {
        assert_eq!(run(llama3, "I'M 12345 ok\n\n  x"), vec!["I", "'M", " ", "123", "45", " ok", "\n\n", " ", " x"]);
        assert_eq!(run(qwen2, "ab12"), vec!["ab", "1", "2"]);
    }
}
