//! Byte-level BPE, llama.cpp's `llm_tokenizer_bpe_session`.
//!
//! Each pre-tokenized word is mapped byte by byte through GPT-2's `bytes_to_unicode`, split
//! into one symbol per byte, and adjacent symbols are merged lowest merge rank first (ties:
//! leftmost first) until no ranked pair remains. Instead of comparing strings, every string
//! that takes part in a merge is interned to an id (vocabulary strings keep their token id,
//! merge parts that are not tokens get ids past the vocabulary), so the rank table is keyed
//! by a pair of ids.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use quarrel_gguf::Gguf;

use crate::error::TokenizerError;
use crate::pretokenize::PreTokenizer;
use crate::symbols::{merge, Sym};
use crate::unicode::BYTE_TO_CHAR;
use crate::vocab::{FastHash, Vocab};

const NONE: u32 = u32::MAX;
const K_MERGES: &str = "tokenizer.ggml.merges";

pub(crate) struct BpeModel {
    pub(crate) pre: PreTokenizer,
    /// (left, right) -> (rank, merged), all interned ids.
    merges: HashMap<(u32, u32), (u32, u32), FastHash>,
    /// Interned id of each byte's GPT-2 character, or NONE.
    byte_ids: [u32; 256],
    n_vocab: u32,
    ignore_merges: bool,
}

impl std::fmt::Debug for BpeModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BpeModel({} merges, {:?})", self.merges.len(), self.pre)
    }
}

/// A candidate merge in the work queue; ordered by rank, then by left position.
type Bigram = Reverse<(u32, u32, u32, u32, u32)>; // (rank, left, right, size, merged)

impl BpeModel {
    pub(crate) fn from_gguf(g: &Gguf, vocab: &Vocab) -> Result<BpeModel, TokenizerError> {
        let merges_raw = g.get_array(K_MERGES)?.ok_or_else(|| TokenizerError::MissingKey(K_MERGES.into()))?;
        let mut merges_str = Vec::with_capacity(merges_raw.len());
        for (i, v) in merges_raw.iter().enumerate() {
            merges_str.push(v.as_str().ok_or_else(|| TokenizerError::InvalidMetadata {
                key: K_MERGES.into(),
                msg: format!("element {i} is {}, not a string", v.type_name()),
            })?);
        }
        let kind = vocab.pre.map(|p| p.kind).unwrap_or(crate::pretok_table::PreKind::Default);
        let pre = PreTokenizer::new(kind)?;
        Ok(Self::build(vocab, &merges_str, pre))
    }

    pub(crate) fn build(vocab: &Vocab, merges_str: &[&str], pre: PreTokenizer) -> BpeModel {
        let n_vocab = vocab.n_tokens() as u32;
        let mut extra: HashMap<String, u32, FastHash> = HashMap::default();
        let mut intern = |s: &str| -> u32 {
            if let Some(&id) = vocab.token_to_id.get(s) {
                return id;
            }
            if let Some(&id) = extra.get(s) {
                return id;
            }
            let id = n_vocab + extra.len() as u32;
            extra.insert(s.to_string(), id);
            id
        };
        let mut merges = HashMap::with_capacity_and_hasher(merges_str.len(), FastHash::default());
        let mut joined = String::new();
        for (rank, m) in merges_str.iter().enumerate() {
            // split at the first space after the first byte, like llama.cpp
            let Some(p) = m.as_bytes().iter().skip(1).position(|&b| b == b' ') else {
                continue;
            };
            let (first, second) = (&m[..p + 1], &m[p + 2..]);
            let (a, b) = (intern(first), intern(second));
            joined.clear();
            joined.push_str(first);
            joined.push_str(second);
            let merged = intern(&joined);
            merges.entry((a, b)).or_insert((rank as u32, merged));
        }
        let mut byte_ids = [NONE; 256];
        let mut buf = [0u8; 4];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            let s: &str = BYTE_TO_CHAR[b].encode_utf8(&mut buf);
            *slot = vocab.token_to_id.get(s).copied().or_else(|| extra.get(s).copied()).unwrap_or(NONE);
        }
        BpeModel { pre, merges, byte_ids, n_vocab, ignore_merges: vocab.ignore_merges }
    }

    /// Tokenizes one raw-text fragment (no special tokens inside) and appends the ids.
    pub(crate) fn encode_fragment(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        let mut syms: Vec<Sym> = Vec::new();
        let mut queue: BinaryHeap<Bigram> = BinaryHeap::new();
        let mut encoded = String::new();
        for word in self.pre.split(text) {
            if self.ignore_merges {
                encoded.clear();
                encoded.extend(word.bytes().map(|b| BYTE_TO_CHAR[b as usize]));
                if let Some(&id) = vocab.token_to_id.get(encoded.as_str()) {
                    out.push(id);
                    continue;
                }
            }
            self.encode_word(word.as_bytes(), &mut syms, &mut queue, out);
        }
    }

    fn encode_word(&self, word: &[u8], syms: &mut Vec<Sym>, queue: &mut BinaryHeap<Bigram>, out: &mut Vec<u32>) {
        syms.clear();
        queue.clear();
        let n = word.len();
        for (i, &b) in word.iter().enumerate() {
            syms.push(Sym::linked(i, n, i, 1, self.byte_ids[b as usize]));
        }
        for i in 1..syms.len() {
            self.push_bigram(syms, queue, i as i32 - 1, i as i32);
        }
        while let Some(Reverse((_, left, right, size, merged))) = queue.pop() {
            let Some((prev, next)) = merge(syms, left as usize, right as usize, size) else {
                continue; // outdated
            };
            syms[left as usize].id = merged;
            self.push_bigram(syms, queue, prev, left as i32);
            self.push_bigram(syms, queue, left as i32, next);
        }
        for s in syms.iter().filter(|s| s.len > 0) {
            if s.id < self.n_vocab {
                out.push(s.id);
            } else {
                // not a token: llama.cpp looks each byte of the encoded text up as a
                // one-byte token, which only ever succeeds for printable ASCII
                for &b in &word[s.start as usize..(s.start + s.len) as usize] {
                    if (0x21..=0x7E).contains(&b) && self.byte_ids[b as usize] < self.n_vocab {
                        out.push(self.byte_ids[b as usize]);
                    }
                }
            }
        }
    }

    #[inline]
    fn push_bigram(&self, syms: &[Sym], queue: &mut BinaryHeap<Bigram>, left: i32, right: i32) {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (&syms[left as usize], &syms[right as usize]);
        if l.id == NONE || r.id == NONE {
            return;
        }
        if let Some(&(rank, merged)) = self.merges.get(&(l.id, r.id)) {
            queue.push(Reverse((rank, left as u32, right as u32, l.len + r.len, merged)));
        }
    }
}
