//! The matmul over repacked weights (`simd::repack`, interleaved row groups): one kernel for
//! one token and for many, called by [`crate::matmul`] where a weight type has a repacked form.

use crate::matmul::{SyncPtr, GEMV_TASKS_PER_THREAD};
use crate::simd;
use crate::{CpuBackend, CpuWeight};

/// The repacked path (`simd::repack`): the same kernel for one token and for many, so every
/// output's bits depend only on its row and token. Tasks split the 16-row groups (and token
/// chunks where there are few groups); a task runs each of its groups over its tokens, 8 at
/// a time, so a group's panel stays in cache while the tokens go by.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_repacked(
    be: &CpuBackend,
    w: &CpuWeight,
    rt: simd::repack::RepackTy,
    packed: &[u8],
    xq: &[u8],
    arb: usize,
    n_tok: usize,
    out: &mut [f32],
) {
    use simd::repack::{self, ActAux, R, TILE_TOKENS};
    let (n_in, n_out) = (w.n_in, w.n_out);
    let nb = n_in / rt.qk();
    let gbytes = rt.group_bytes(n_in);
    let mut aux = vec![ActAux::default(); nb * n_tok];
    let fill = |t: usize, a: &mut [ActAux]| repack::act_aux(rt, n_in, &xq[t * arb..(t + 1) * arb], a);
    if n_tok >= 8 {
        be.par_chunks_mut(&mut aux, nb, &fill);
    } else {
        aux.chunks_mut(nb).enumerate().for_each(|(t, a)| fill(t, a));
    }
    let aux: &[ActAux] = &aux;
    let n_groups = n_out.div_ceil(R);
    let want = GEMV_TASKS_PER_THREAD * be.n_threads().max(1);
    let gpt = n_groups.div_ceil(want.min(n_groups));
    let row_tasks = n_groups.div_ceil(gpt);
    let chunks = n_tok.div_ceil(TILE_TOKENS);
    let cpt = chunks.div_ceil(want.div_ceil(row_tasks).min(chunks));
    let tok_tasks = chunks.div_ceil(cpt);
    let out_ptr = SyncPtr(out.as_mut_ptr());
    be.for_each_task(row_tasks * tok_tasks, &|task| {
        let (g0, c0) = (task / tok_tasks * gpt, task % tok_tasks * cpt);
        let (g1, c1) = ((g0 + gpt).min(n_groups), (c0 + cpt).min(chunks));
        let mut tile = [[0f32; R]; TILE_TOKENS];
        for g in g0..g1 {
            let group = &packed[g * gbytes..(g + 1) * gbytes];
            let (r0, nr) = (g * R, R.min(n_out - g * R));
            for c in c0..c1 {
                let (t0, t1) = (c * TILE_TOKENS, (c * TILE_TOKENS + TILE_TOKENS).min(n_tok));
                let mut acts: [(&[u8], &[ActAux]); TILE_TOKENS] = [(&[], &[]); TILE_TOKENS];
                for t in t0..t1 {
                    acts[t - t0] = (&xq[t * arb..(t + 1) * arb], &aux[t * nb..(t + 1) * nb]);
                }
                repack::tile(rt, n_in, group, &acts[..t1 - t0], &mut tile);
                for t in t0..t1 {
                    // SAFETY: (token, row) pairs are disjoint across tasks; the range ends
                    // at t * n_out + r0 + nr <= n_tok * n_out = out.len().
                    unsafe { out_ptr.write_slice(t * n_out + r0, &tile[t - t0][..nr]) };
                }
            }
        }
    });
}
