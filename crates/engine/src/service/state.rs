//! Recurrent-state prefix checkpoints for the scheduler (hybrid Mamba2 models).

/// Snapshots of a sequence's recurrent state at chunk boundaries, keyed by the prefix-cache
/// hash of the block ending there, in state slots of their own; least recently used first out.
#[derive(Default)]
pub(crate) struct Checkpoints {
    pub(crate) slot_of: std::collections::HashMap<u64, (u32, u64)>,
    pub(crate) free: Vec<u32>,
    tick: u64,
}

impl Checkpoints {
    /// Checkpoints in these state slots.
    pub(crate) fn new(slots: impl Iterator<Item = u32>) -> Checkpoints {
        let mut free: Vec<u32> = slots.collect();
        free.reverse();
        Checkpoints { free, ..Default::default() }
    }

    pub(crate) fn get(&mut self, hash: u64) -> Option<u32> {
        self.tick += 1;
        let t = self.tick;
        self.slot_of.get_mut(&hash).map(|e| {
            e.1 = t;
            e.0
        })
    }

    /// A slot for a new checkpoint of `hash` (a free one, or the least recently used).
    pub(crate) fn insert(&mut self, hash: u64) -> Option<u32> {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                let (&old, &(s, _)) = self.slot_of.iter().min_by_key(|(_, (_, t))| *t)?;
                self.slot_of.remove(&old);
                s
            }
        };
        self.tick += 1;
        self.slot_of.insert(hash, (slot, self.tick));
        Some(slot)
    }

    pub(crate) fn forget(&mut self, hash: u64) {
        if let Some((s, _)) = self.slot_of.remove(&hash) {
            self.free.push(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_recently_used_checkpoint_is_replaced() {
        let mut c = Checkpoints { free: vec![11, 10], ..Default::default() };
        assert_eq!(c.insert(1), Some(10));
        assert_eq!(c.insert(2), Some(11));
        assert_eq!(c.get(1), Some(10)); // 2 is now the oldest
        assert_eq!(c.insert(3), Some(11));
        assert_eq!(c.get(2), None);
        c.forget(1);
        assert_eq!(c.insert(4), Some(10));
        assert_eq!(c.slot_of.len(), 2);
    }
}
