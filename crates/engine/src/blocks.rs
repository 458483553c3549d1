//! KV block pool: fixed-size blocks of token slots handed to sequences.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
#[error("KV cache full: {needed} blocks needed, {free} free of {total}")]
pub struct OutOfBlocks {
    pub needed: usize,
    pub free: usize,
    pub total: usize,
}

/// Free list of physical block ids.
pub struct BlockPool {
    free: Vec<u32>,
    n_blocks: usize,
    pub block_size: usize,
}

impl BlockPool {
    pub fn new(n_blocks: usize, block_size: usize) -> BlockPool {
        BlockPool { free: (0..n_blocks as u32).rev().collect(), n_blocks, block_size }
    }

    pub fn n_free(&self) -> usize {
        self.free.len()
    }

    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// Grow `table` so it covers `n_tokens` positions; all-or-nothing.
    pub fn reserve(&mut self, table: &mut Vec<u32>, n_tokens: usize) -> Result<(), OutOfBlocks> {
        let needed = n_tokens.div_ceil(self.block_size).saturating_sub(table.len());
        if needed > self.free.len() {
            return Err(OutOfBlocks { needed, free: self.free.len(), total: self.n_blocks });
        }
        for _ in 0..needed {
            table.push(self.free.pop().expect("checked above"));
        }
        Ok(())
    }

    /// Return a sequence's blocks.
    pub fn release(&mut self, table: &mut Vec<u32>) {
        self.free.append(table);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn no_block_leaks_or_double_use(ops in proptest::collection::vec((0usize..4, 0usize..200), 1..60)) {
            let mut pool = BlockPool::new(20, 16);
            let mut tables: Vec<Vec<u32>> = vec![vec![]; 4];
            for (seq, n) in ops {
                if n % 5 == 0 {
                    pool.release(&mut tables[seq]);
                } else {
                    let before = tables[seq].clone();
                    if pool.reserve(&mut tables[seq], n).is_err() {
                        prop_assert_eq!(&tables[seq], &before);
                    }
                }
                let mut all: Vec<u32> = tables.iter().flatten().copied().collect();
                let used = all.len();
                all.sort();
                all.dedup();
                prop_assert_eq!(all.len(), used);
                prop_assert_eq!(used + pool.n_free(), 20);
            }
        }
    }
}
