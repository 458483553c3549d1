//! Recurrent state for the scheduler (hybrid Mamba2 models): a state slot per running
//! request, and prefix checkpoints of the state at chunk boundaries.

use super::scheduler::Scheduler;
use super::step_model::StepModel;
use super::types::RequestId;

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

impl<M: StepModel> Scheduler<M> {
    /// Give every running request a state slot (recurrent models); slots of requests no
    /// longer running return to the free list first.
    pub(super) fn assign_slots(&mut self) {
        if self.scratch_slot.is_none() {
            return;
        }
        self.gc_slots(None);
        let ids: Vec<RequestId> = self.running.iter().map(|s| s.id).collect();
        for id in ids {
            self.slot_for(id);
        }
    }

    /// Return the slots of requests no longer running (`keep`: one about to run).
    fn gc_slots(&mut self, keep: Option<RequestId>) {
        let running: std::collections::HashSet<RequestId> = self.running.iter().map(|s| s.id).chain(keep).collect();
        let free = &mut self.free_slots;
        self.slot_of.retain(|id, slot| {
            let keep = running.contains(id);
            if !keep {
                free.push(*slot);
            }
            keep
        });
    }

    fn slot_for(&mut self, id: RequestId) -> Option<u32> {
        if let Some(&s) = self.slot_of.get(&id) {
            return Some(s);
        }
        let slot = self.free_slots.pop()?;
        self.slot_of.insert(id, slot);
        Some(slot)
    }

    /// Recurrent models: the longest prefix of the cached blocks `hashes` that ends where a
    /// state checkpoint was taken; that checkpoint is copied into the request's slot. Returns
    /// the number of blocks to keep (0: recompute from the start).
    pub(super) fn restore_checkpoint(&mut self, id: RequestId, hashes: &[u64]) -> usize {
        let Some(k) = (1..=hashes.len()).rev().find(|&k| self.ckpt.slot_of.contains_key(&hashes[k - 1])) else { return 0 };
        self.gc_slots(Some(id));
        let (Some(src), Some(dst)) = (self.ckpt.get(hashes[k - 1]), self.slot_for(id)) else { return 0 };
        match self.model.copy_state(src, dst) {
            Ok(()) => k,
            Err(_) => {
                self.ckpt.forget(hashes[k - 1]);
                0
            }
        }
    }

    /// Recurrent models: snapshot the state of requests whose prompt processing just ended a
    /// chunk on a block boundary, under the hash of that block.
    pub(super) fn take_checkpoints(&mut self, done: &[(RequestId, usize, u64)]) {
        for &(id, _, hash) in done {
            if self.ckpt.slot_of.contains_key(&hash) {
                continue;
            }
            let Some(&src) = self.slot_of.get(&id) else { continue };
            let Some(dst) = self.ckpt.insert(hash) else { continue };
            if self.model.copy_state(src, dst).is_err() {
                self.ckpt.forget(hash);
            }
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
