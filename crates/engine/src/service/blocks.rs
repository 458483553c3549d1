//! Reference-counted KV blocks with a prefix cache.
//!
//! A full block is identified by the hash of (parent block's hash, its token ids), so equal
//! hashes mean equal token prefixes (the tokens are stored too and compared, so a hash
//! collision can never hand out wrong KV). Blocks nobody references stay cached, in LRU
//! order, and are evicted only when a fresh block is needed.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

/// Hash of a full block given its parent's hash (0 for the first block).
pub fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    // SipHash with fixed keys: stable within and across processes.
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new_with_keys(0x5175_6172_7265_6c21, 0x6b76_2d62_6c6f_636b);
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

struct Cached {
    hash: u64,
    parent: u64,
    tokens: Vec<u32>,
}

pub struct BlockManager {
    block_size: usize,
    refcount: Vec<u32>,
    cached: Vec<Option<Cached>>,
    by_hash: HashMap<u64, u32>,
    /// Unhashed free blocks.
    free: Vec<u32>,
    /// Unreferenced hashed blocks by last use (tick -> block).
    lru: BTreeMap<u64, u32>,
    lru_tick: Vec<u64>,
    tick: u64,
    prefix_cache: bool,
}

impl BlockManager {
    pub fn new(n_blocks: usize, block_size: usize, prefix_cache: bool) -> BlockManager {
        BlockManager {
            block_size,
            refcount: vec![0; n_blocks],
            cached: (0..n_blocks).map(|_| None).collect(),
            by_hash: HashMap::new(),
            free: (0..n_blocks as u32).rev().collect(),
            lru: BTreeMap::new(),
            lru_tick: vec![0; n_blocks],
            tick: 0,
            prefix_cache,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn n_blocks(&self) -> usize {
        self.refcount.len()
    }

    /// Blocks that can be handed out now (free or evictable).
    pub fn n_available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// Unreferenced blocks kept for reuse.
    pub fn n_cached(&self) -> usize {
        self.lru.len()
    }

    pub fn n_used(&self) -> usize {
        self.n_blocks() - self.n_available()
    }

    /// A fresh private block, evicting the least recently used cached block if needed.
    pub fn alloc(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (&t, &b) = self.lru.iter().next()?;
                self.lru.remove(&t);
                if let Some(c) = self.cached[b as usize].take() {
                    self.by_hash.remove(&c.hash);
                }
                b
            }
        };
        debug_assert_eq!(self.refcount[b as usize], 0);
        self.refcount[b as usize] = 1;
        Some(b)
    }

    /// Grow `table` to cover `n_tokens` positions; all or nothing.
    pub fn reserve(&mut self, table: &mut Vec<u32>, n_tokens: usize) -> bool {
        let needed = n_tokens.div_ceil(self.block_size).saturating_sub(table.len());
        if needed > self.n_available() {
            return false;
        }
        for _ in 0..needed {
            table.push(self.alloc().expect("counted above"));
        }
        true
    }

    /// Blocks needed to grow a table of `have` blocks to `n_tokens` positions.
    pub fn blocks_needed(&self, have: usize, n_tokens: usize) -> usize {
        n_tokens.div_ceil(self.block_size).saturating_sub(have)
    }

    /// The longest cached chain for these full-block hashes (with their tokens), each block
    /// referenced once more. Returns the block ids, in order.
    pub fn lookup(&mut self, chain: &[(u64, &[u32])]) -> Vec<u32> {
        let mut out = vec![];
        if !self.prefix_cache {
            return out;
        }
        let mut parent = 0u64;
        for &(h, toks) in chain {
            let Some(&b) = self.by_hash.get(&h) else { break };
            let ok = self.cached[b as usize].as_ref().is_some_and(|c| c.parent == parent && c.tokens == toks);
            if !ok {
                break;
            }
            if self.refcount[b as usize] == 0 {
                self.lru.remove(&self.lru_tick[b as usize]);
            }
            self.refcount[b as usize] += 1;
            out.push(b);
            parent = h;
        }
        out
    }

    /// Record that `block` now holds the full block `tokens` under `hash`. A no-op when
    /// caching is off or another block already holds that content.
    pub fn register(&mut self, block: u32, parent: u64, hash: u64, tokens: &[u32]) {
        if !self.prefix_cache || self.by_hash.contains_key(&hash) || self.cached[block as usize].is_some() {
            return;
        }
        self.by_hash.insert(hash, block);
        self.cached[block as usize] = Some(Cached { hash, parent, tokens: tokens.to_vec() });
    }

    /// Drop one reference to each block of `table` (emptied).
    pub fn release(&mut self, table: &mut Vec<u32>) {
        // later blocks first, so that a chain's tail is evicted before its head
        for b in table.drain(..).rev() {
            let rc = &mut self.refcount[b as usize];
            debug_assert!(*rc > 0, "double release of block {b}");
            *rc = rc.saturating_sub(1);
            if *rc == 0 {
                if self.cached[b as usize].is_some() {
                    self.tick += 1;
                    self.lru_tick[b as usize] = self.tick;
                    self.lru.insert(self.tick, b);
                } else {
                    self.free.push(b);
                }
            }
        }
    }

    /// Forget every cached block (their KV stays valid but is no longer found).
    pub fn clear_cache(&mut self) {
        for (_, b) in std::mem::take(&mut self.lru) {
            self.cached[b as usize] = None;
            self.free.push(b);
        }
        self.by_hash.retain(|_, b| self.refcount[*b as usize] > 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn chain(tokens: &[u32], bs: usize) -> Vec<(u64, Vec<u32>)> {
        let mut parent = 0;
        tokens
            .chunks_exact(bs)
            .map(|c| {
                parent = block_hash(parent, c);
                (parent, c.to_vec())
            })
            .collect()
    }

    #[test]
    fn shared_prefix_is_found_and_refcounted() {
        let mut m = BlockManager::new(8, 4, true);
        let toks: Vec<u32> = (0..12).collect();
        let mut t = vec![];
        assert!(m.reserve(&mut t, 12));
        let c = chain(&toks, 4);
        let mut parent = 0;
        for (i, (h, tk)) in c.iter().enumerate() {
            m.register(t[i], parent, *h, tk);
            parent = *h;
        }
        let refs: Vec<(u64, &[u32])> = c.iter().map(|(h, v)| (*h, v.as_slice())).collect();
        let mut t2 = m.lookup(&refs[..2]);
        assert_eq!(t2, t[..2].to_vec());
        m.release(&mut t);
        assert_eq!(m.n_cached(), 1); // block 3 is unreferenced, blocks 1-2 still used by t2
        m.release(&mut t2);
        assert_eq!(m.n_cached(), 3);
        assert_eq!(m.n_available(), 8);
        // a different second block stops the chain
        let other: Vec<u32> = vec![0, 1, 2, 3, 9, 9, 9, 9];
        let oc = chain(&other, 4);
        let orefs: Vec<(u64, &[u32])> = oc.iter().map(|(h, v)| (*h, v.as_slice())).collect();
        let mut t3 = m.lookup(&orefs);
        assert_eq!(t3.len(), 1);
        m.release(&mut t3);
    }

    proptest! {
        #[test]
        fn never_leaks_or_double_hands_out(ops in proptest::collection::vec((0usize..5, 0u32..3, 1usize..40), 1..80)) {
            let bs = 4;
            let mut m = BlockManager::new(24, bs, true);
            let mut tables: Vec<Vec<u32>> = vec![vec![]; 5];
            for (seq, kind, n) in ops {
                match kind {
                    0 => m.release(&mut tables[seq]),
                    1 => {
                        // a prompt drawn from a small alphabet so prefixes repeat
                        if tables[seq].is_empty() {
                            let toks: Vec<u32> = (0..n as u32).map(|i| i % 3 + (n as u32 % 2)).collect();
                            let c = chain(&toks, bs);
                            let refs: Vec<(u64, &[u32])> = c.iter().map(|(h, v)| (*h, v.as_slice())).collect();
                            tables[seq] = m.lookup(&refs);
                            if m.reserve(&mut tables[seq], n) {
                                let mut parent = 0;
                                for (i, (h, tk)) in c.iter().enumerate() {
                                    m.register(tables[seq][i], parent, *h, tk);
                                    parent = *h;
                                }
                            }
                        }
                    }
                    _ => {
                        let want = tables[seq].len() * bs + n;
                        let before = tables[seq].clone();
                        if !m.reserve(&mut tables[seq], want) {
                            prop_assert_eq!(&tables[seq], &before);
                        }
                    }
                }
                // every referenced block is counted; nothing free is referenced
                let mut counts = vec![0u32; 24];
                for t in &tables {
                    for &b in t {
                        counts[b as usize] += 1;
                    }
                }
                prop_assert_eq!(&counts, &m.refcount);
                let used = counts.iter().filter(|&&c| c > 0).count();
                prop_assert_eq!(used + m.n_available(), 24);
            }
            for t in &mut tables {
                m.release(t);
            }
            prop_assert_eq!(m.n_available(), 24);
        }
    }
}
