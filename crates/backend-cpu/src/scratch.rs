//! Step buffers handed back by the models crate (`Backend::recycle`) and handed out again
//! by `Backend::scratch`: a decode step of many sequences otherwise allocates and zeroes
//! ~270 buffers (~14 MB for SmolLM2 at 16 sequences), and its small buffers stay hot in
//! cache when reused.
//!
//! A scratch buffer's contents are whatever its last user left (initialized `f32`s: no
//! unsafety); callers take one only for an output that the next op overwrites in full.
//! `QUARREL_CPU_SCRATCH_POISON=1` fills every scratch buffer with NaN instead, to catch an
//! op that reads its output before writing it. `QUARREL_CPU_NO_SCRATCH=1` keeps nothing (every
//! scratch buffer newly allocated and zeroed: the old behaviour, for A/B runs).

use std::sync::Mutex;

/// Most buffers kept; beyond it a handed-back buffer is freed.
const MAX_BUFS: usize = 64;
/// Most bytes kept.
const MAX_BYTES: usize = 256 << 20;
/// A kept buffer not taken again within this many `take`s is freed (a few decode steps of a
/// Llama-like model): a prefill's large buffers do not stay held through a long decode.
const MAX_AGE: u64 = 4096;

/// Free buffers, reused best-fit by capacity.
#[derive(Default)]
pub(crate) struct ScratchCache {
    free: Mutex<Free>,
    poison: bool,
    off: bool,
}

impl ScratchCache {
    pub(crate) fn new() -> ScratchCache {
        let on = |k: &str| std::env::var(k).is_ok_and(|v| v == "1");
        ScratchCache { free: Mutex::new(Free::default()), poison: on("QUARREL_CPU_SCRATCH_POISON"), off: on("QUARREL_CPU_NO_SCRATCH") }
    }

    /// A kept buffer of capacity in `[n, 2n]` (the smallest such), resized to `n`; `None`
    /// when none fits. New elements (a buffer grown within its capacity) are zero.
    pub(crate) fn take(&self, n: usize) -> Option<Vec<f32>> {
        if n == 0 {
            return None;
        }
        let mut v = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            free.tick += 1;
            let best = free
                .bufs
                .iter()
                .enumerate()
                .filter(|(_, (b, _))| b.capacity() >= n && b.capacity() / 2 <= n)
                .min_by_key(|(_, (b, _))| b.capacity())
                .map(|(i, _)| i)?;
            free.bytes -= free.bufs[best].0.capacity() * 4;
            free.bufs.swap_remove(best).0
        };
        if v.len() > n {
            v.truncate(n);
        } else {
            v.resize(n, 0.0);
        }
        if self.poison {
            v.fill(f32::NAN);
        }
        Some(v)
    }

    /// Whether fresh buffers must be poisoned too.
    pub(crate) fn poison(&self) -> bool {
        self.poison
    }

    /// Keep `v` for a later `take` (freed if the cache is full); frees buffers kept too long.
    pub(crate) fn give(&self, v: Vec<f32>) {
        if v.capacity() == 0 || self.off {
            return;
        }
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let now = free.tick;
        if free.bufs.iter().any(|&(_, t)| t + MAX_AGE < now) {
            free.bufs.retain(|&(_, t)| t + MAX_AGE >= now);
            free.bytes = free.bufs.iter().map(|(b, _)| b.capacity() * 4).sum();
        }
        if free.bufs.len() < MAX_BUFS && free.bytes + v.capacity() * 4 <= MAX_BYTES {
            free.bytes += v.capacity() * 4;
            free.bufs.push((v, now));
        }
    }
}

/// The kept buffers, each with the `take` count when it was handed back.
#[derive(Default)]
struct Free {
    bufs: Vec<(Vec<f32>, u64)>,
    bytes: usize,
    tick: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_by_capacity_and_resizes() {
        let c = ScratchCache::new();
        assert!(c.take(10).is_none());
        c.give(vec![1.0; 100]);
        assert!(c.take(40).is_none(), "capacity 100 is more than twice 40");
        let v = c.take(60).unwrap();
        assert_eq!(v.len(), 60);
        assert!(v.capacity() >= 100);
        c.give(v);
        let v = c.take(100).unwrap();
        assert_eq!(v.len(), 100);
        assert!(c.take(100).is_none());
    }

    #[test]
    fn keeps_at_most_max_bufs() {
        let c = ScratchCache::new();
        for _ in 0..MAX_BUFS + 5 {
            c.give(vec![0.0; 8]);
        }
        let mut n = 0;
        while c.take(8).is_some() {
            n += 1;
        }
        assert_eq!(n, MAX_BUFS);
    }

    #[test]
    fn frees_buffers_not_taken_for_long() {
        let c = ScratchCache::new();
        c.give(vec![0.0; 1000]);
        for _ in 0..MAX_AGE + 1 {
            assert!(c.take(8).is_none());
        }
        c.give(vec![0.0; 8]);
        assert!(c.take(1000).is_none(), "the old buffer was freed");
        assert!(c.take(8).is_some());
    }
}
