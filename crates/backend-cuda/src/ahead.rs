//! Prefetching the next GEMV's weights during the attention (decode steps).
//!
//! A decode step alternates weight-streaming GEMVs with kernels that read little memory; the
//! longest of those is the attention (RoPE'd q against a short KV cache: ~10 us a layer on a 7B
//! model, while the DRAM would stream ~30 MB). Each GEMV already asks L2 for its own rows before
//! it waits for its predecessor (`gemv_prefetch`, kernels/matmul.cu); the GEMV launched right
//! after an attention kernel (the O projection) also asks for the first bytes of the GEMV that
//! comes after it (gate/up): `gemva_*`. Steps repeat, so which GEMV follows which is learned
//! from the launches themselves (keyed by the weight's address), with no help from the model
//! code; an address is trusted only while no large allocation was freed since it was learned
//! (`device::FREE_EPOCH`), so a prefetch never touches memory that was given back.
//!
//! `QUARREL_CUDA_AHEAD=<MiB>` sets how much (0: off), `QUARREL_CUDA_AHEAD_ALL=1` prefetches
//! ahead after every GEMV, not only after attention (measurement switches).

use crate::device::{Device, FREE_EPOCH};
use crate::matmul::GemvItem;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

/// MiB of the next GEMV's weights prefetched while the attention runs.
const DEFAULT_MIB: usize = 24;

/// Ranges of one prefetch: payload and meta planes of the next GEMV's first two matrices.
pub(crate) type Ranges = [(u64, u64); 4];

/// Which GEMV (by its first matrix's payload address) follows which.
#[derive(Default)]
pub(crate) struct Ahead {
    /// the first matrix of the GEMV launched last
    prev: Option<u64>,
    /// `FREE_EPOCH` when `next` was learned
    epoch: u64,
    next: HashMap<u64, Ranges>,
}

/// (bytes, after every GEMV) from the environment.
fn settings() -> (u64, bool) {
    static S: std::sync::OnceLock<(u64, bool)> = std::sync::OnceLock::new();
    *S.get_or_init(|| {
        let mib = std::env::var("QUARREL_CUDA_AHEAD").ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(DEFAULT_MIB as u64);
        (mib << 20, std::env::var("QUARREL_CUDA_AHEAD_ALL").is_ok_and(|v| v == "1"))
    })
}

/// The first `budget` bytes of `items` in the order a joined GEMV reads them (matrix by
/// matrix; of each matrix the same leading share of rows from both planes), at most two
/// matrices; ranges rounded down to 256 bytes.
pub(crate) fn leading(items: &[[(u64, usize); 2]], budget: u64) -> Ranges {
    let mut out = [(0u64, 0u64); 4];
    let mut left = budget as f64;
    for (k, planes) in items.iter().take(2).enumerate() {
        let total = (planes[0].1 + planes[1].1) as f64;
        if total <= 0.0 || left <= 0.0 {
            break;
        }
        let f = (left / total).min(1.0);
        for (j, &(p, n)) in planes.iter().enumerate() {
            let take = if f >= 1.0 { n as u64 } else { ((n as f64 * f) as u64) & !255 };
            if p != 0 && take > 0 {
                out[2 * k + j] = (p, take);
            }
        }
        left -= f * total;
    }
    out
}

/// Record that the GEMV of `items` is launched now (it follows the one launched before) and
/// return what it should prefetch ahead, if anything.
pub(crate) fn learn(dev: &Device, items: &[GemvItem]) -> Option<Ranges> {
    let (budget, all) = settings();
    if budget == 0 || !dev.pdl_on() || items.is_empty() {
        return None;
    }
    let after_attn = dev.after_attn.load(Ordering::Relaxed);
    let epoch = FREE_EPOCH.load(Ordering::Relaxed);
    let first = items[0].planes()[0].0;
    let mut a = dev.ahead.lock().ok()?;
    if a.epoch != epoch {
        a.next.clear();
        a.prev = None;
        a.epoch = epoch;
    }
    let planes: Vec<[(u64, usize); 2]> = items.iter().map(|i| i.planes()).collect();
    if let Some(prev) = a.prev.replace(first) {
        a.next.insert(prev, leading(&planes, budget));
    }
    if !(after_attn || all) {
        return None;
    }
    a.next.get(&first).copied().filter(|r| r.iter().any(|&(_, n)| n > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The leading share: whole matrices while the budget lasts, then the same share of rows
    /// of both planes of the next, never more than asked (up to rounding), at most two matrices.
    #[test]
    fn leading_takes_matrices_in_order() {
        let a = [(0x1000u64, 1 << 20), (0x9000_0000u64, 1 << 17)];
        let b = [(0x2000_0000u64, 1 << 20), (0xa000_0000u64, 1 << 17)];
        let c = [(0x3000_0000u64, 1 << 20), (0u64, 0)];
        let whole = leading(&[a, b, c], 1 << 30);
        assert_eq!(whole, [(a[0].0, 1 << 20), (a[1].0, 1 << 17), (b[0].0, 1 << 20), (b[1].0, 1 << 17)]);
        let half = leading(&[a, b], ((1 << 20) + (1 << 17)) / 2);
        assert_eq!(half[0], (a[0].0, 1 << 19));
        assert_eq!(half[1], (a[1].0, 1 << 16));
        assert_eq!(half[2].1 + half[3].1, 0);
        let more = leading(&[a, b], (1 << 20) + (1 << 17) + (1 << 18));
        assert_eq!(more[1].1, 1 << 17);
        assert!(more[2].1 > 0 && more[2].1 + more[3].1 <= 1 << 18, "{more:?}");
        // no meta plane: only the payload range
        let p = leading(&[c], 1 << 19);
        assert_eq!(p, [(c[0].0, 1 << 19), (0, 0), (0, 0), (0, 0)]);
        assert_eq!(leading(&[a], 0), [(0, 0); 4]);
    }
}
