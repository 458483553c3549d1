//! Mamba2 ops on the CPU: conv1d with carried state, the selective scan (heads in parallel
//! on the spin pool, f64 recomputation of any head-step whose f32 result is not finite) and
//! the gated grouped RMSNorm. Recurrent state lives in `CpuKv::state`, one slot per sequence.

use crate::ggml_math::{fold_lanes, silu_ggml};
use crate::matmul::SyncPtr;
use crate::{CpuBackend, CpuKv};
use quarrel_core::ssm::{conv_with, softplus, ConvInputs};
use quarrel_core::{CoreError, ForwardBatch, Result, SsmParams, StateSpec};
use std::sync::atomic::{AtomicU64, Ordering};

/// f32 recurrent state of every recurrent layer: `conv[layer]` and `ssm[layer]` hold
/// `n_slots` slot-major copies of the per-sequence state.
pub struct CpuState {
    pub spec: StateSpec,
    pub(crate) conv: Vec<Vec<f32>>,
    pub(crate) ssm: Vec<Vec<f32>>,
    /// Non-finite values met in SSM state so far.
    pub non_finite: AtomicU64,
}

impl CpuState {
    pub fn new(spec: &StateSpec) -> Result<CpuState> {
        let mut conv = Vec::new();
        let mut ssm = Vec::new();
        for l in &spec.layers {
            let (c, s) = l.map_or((0, 0), |p| (p.conv_state_len(), p.ssm_state_len()));
            let n =
                |len: usize| len.checked_mul(spec.n_slots).ok_or_else(|| CoreError::OutOfMemory("recurrent state size overflows".into()));
            conv.push(vec![0f32; n(c)?]);
            ssm.push(vec![0f32; n(s)?]);
        }
        Ok(CpuState { spec: spec.clone(), conv, ssm, non_finite: AtomicU64::new(0) })
    }

    /// Copy every layer's state of slot `src` to slot `dst` (prefix checkpoints).
    pub fn copy_slot(&mut self, src: usize, dst: usize) -> Result<()> {
        if src >= self.spec.n_slots || dst >= self.spec.n_slots {
            return Err(CoreError::Shape(format!("state slot {src} -> {dst} of {}", self.spec.n_slots)));
        }
        for (l, p) in self.spec.layers.iter().enumerate() {
            if let Some(p) = p {
                let (c, s) = (p.conv_state_len(), p.ssm_state_len());
                self.conv[l].copy_within(src * c..(src + 1) * c, dst * c);
                self.ssm[l].copy_within(src * s..(src + 1) * s, dst * s);
            }
        }
        Ok(())
    }
}

/// (slot, token range) of each sequence, checked against the state and the batch.
fn seq_slots(st: &CpuState, layer: usize, p: &SsmParams, batch: &ForwardBatch) -> Result<Vec<(usize, usize, usize, bool)>> {
    if st.spec.layers.get(layer).copied().flatten() != Some(*p) {
        return Err(CoreError::Shape(format!("layer {layer} has no recurrent state of shape {p:?}")));
    }
    if batch.state_slots.len() != batch.seqs.len() {
        return Err(CoreError::Shape(format!("{} state slots for {} sequences", batch.state_slots.len(), batch.seqs.len())));
    }
    batch
        .seqs
        .iter()
        .zip(&batch.state_slots)
        .map(|(s, &slot)| {
            if slot as usize >= st.spec.n_slots {
                return Err(CoreError::Shape(format!("state slot {slot} of {}", st.spec.n_slots)));
            }
            let fresh = s.len > 0 && batch.positions[s.start] == 0;
            Ok((slot as usize, s.start, s.len, fresh))
        })
        .collect()
}

fn state_mut(kv: &mut CpuKv) -> Result<&mut CpuState> {
    kv.state.as_mut().ok_or_else(|| CoreError::Shape("the cache has no recurrent state (alloc_state not called)".into()))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn ssm_conv(
    kv: &mut CpuKv,
    layer: usize,
    p: &SsmParams,
    zxbcdt: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    batch: &ForwardBatch,
    out: &mut [f32],
) -> Result<()> {
    let st = state_mut(kv)?;
    let (cd, dp, n) = (p.conv_dim(), p.d_in_proj(), batch.n_tokens());
    if zxbcdt.len() != n * dp || out.len() != n * cd || w.len() != cd * p.d_conv || bias.is_some_and(|b| b.len() != cd) {
        return Err(CoreError::Shape(format!("ssm_conv: shapes do not match {p:?} for {n} tokens")));
    }
    let cl = p.conv_state_len();
    for (slot, start, len, fresh) in seq_slots(st, layer, p, batch)? {
        let state = &mut st.conv[layer][slot * cl..(slot + 1) * cl];
        if fresh {
            state.fill(0.0);
        }
        let inp = ConvInputs { xbc: &zxbcdt[start * dp..], stride: dp, col0: p.d_inner, w, bias };
        conv_seq(p, &inp, state, &mut out[start * cd..(start + len) * cd]);
    }
    Ok(())
}

fma_dispatch! {
    /// `quarrel_core::ssm::conv_reference` with ggml's AVX-512 build's rounding: the window
    /// dot product accumulated with fused multiply-adds (the compiler contracts ggml's scalar
    /// loop), `ggml_v_silu` on the 16-aligned part of each row and libm SiLU on the rest.
    fn conv_seq(p: &SsmParams, inp: &ConvInputs<'_>, state: &mut [f32], out: &mut [f32]) => conv_seq_body
}

#[inline(always)]
fn conv_seq_body(p: &SsmParams, inp: &ConvInputs<'_>, state: &mut [f32], out: &mut [f32]) {
    let vec_end = p.conv_dim() & !15;
    conv_with(p, inp, state, out, |s, x, w| x.mul_add(w, s), |ch, v| if ch < vec_end { silu_ggml(v) } else { v / (1.0 + (-v).exp()) });
}

/// The 64-wide steps of one state row: `s = s*da + b*xdt` (two multiplies and an add), and
/// four 16-lane accumulators `acc[j][l] += s*c` (FMA) over the steps. Scalar twin.
#[inline(always)]
fn lanes_scalar(s: &mut [f32], b: &[f32], c: &[f32], da: f32, xdt: f32) -> [[f32; 16]; 4] {
    let mut acc = [[0f32; 16]; 4];
    for ((sc, bc), cc) in s.chunks_exact_mut(64).zip(b.chunks_exact(64)).zip(c.chunks_exact(64)) {
        for (j, accj) in acc.iter_mut().enumerate() {
            for l in 0..16 {
                let k = j * 16 + l;
                let v = sc[k] * da + bc[k] * xdt;
                accj[l] = v.mul_add(cc[k], accj[l]);
                sc[k] = v;
            }
        }
    }
    acc
}

/// [`lanes_scalar`] with AVX-512 (the same operations per lane, so the same bits).
#[inline(always)]
fn lanes_avx512(s: &mut [f32], b: &[f32], c: &[f32], da: f32, xdt: f32) -> [[f32; 16]; 4] {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: only reached from scan_head_avx512 (avx512f detected); slices are whole steps
    // of 64 and every access is within them.
    unsafe {
        use std::arch::x86_64::*;
        let (vda, vxdt) = (_mm512_set1_ps(da), _mm512_set1_ps(xdt));
        let mut acc = [_mm512_setzero_ps(); 4];
        let n = s.len() / 64 * 64;
        let (sp, bp, cp) = (s.as_mut_ptr(), b.as_ptr(), c.as_ptr());
        let mut k0 = 0;
        while k0 < n {
            for (j, aj) in acc.iter_mut().enumerate() {
                let k = k0 + j * 16;
                let sv = _mm512_loadu_ps(sp.add(k));
                let v = _mm512_add_ps(_mm512_mul_ps(sv, vda), _mm512_mul_ps(_mm512_loadu_ps(bp.add(k)), vxdt));
                *aj = _mm512_fmadd_ps(v, _mm512_loadu_ps(cp.add(k)), *aj);
                _mm512_storeu_ps(sp.add(k), v);
            }
            k0 += 64;
        }
        let mut out = [[0f32; 16]; 4];
        for (o, a) in out.iter_mut().zip(acc) {
            _mm512_storeu_ps(o.as_mut_ptr(), a);
        }
        out
    }
    #[cfg(not(target_arch = "x86_64"))]
    lanes_scalar(s, b, c, da, xdt)
}

/// Per-head inputs of the CPU scan.
pub(crate) struct ScanArgs<'a> {
    pub p: &'a SsmParams,
    pub xbc: &'a [f32],
    pub zxbcdt: &'a [f32],
    pub a: &'a [f32],
    pub d: &'a [f32],
    pub dt_bias: &'a [f32],
}

/// Scan head `h` of tokens `start..start+len` against `state` (that head's `head_dim *
/// d_state` values), writing y through `y`. Returns non-finite values met.
///
/// # Safety
/// `y` must be valid for `(start+len) * d_inner` writes; tasks write disjoint (token, head) cells.
pub(crate) unsafe fn scan_head(a: &ScanArgs<'_>, h: usize, start: usize, len: usize, state: &mut [f32], y: SyncPtr) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return scan_head_avx512(a, h, start, len, state, y);
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            return scan_head_avx2(a, h, start, len, state, y);
        }
    }
    scan_head_body::<false>(a, h, start, len, state, y)
}

// The same code compiled for wider vectors: lanes are independent, so the bits do not change.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn scan_head_avx512(a: &ScanArgs<'_>, h: usize, start: usize, len: usize, state: &mut [f32], y: SyncPtr) -> u64 {
    scan_head_body::<true>(a, h, start, len, state, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scan_head_avx2(a: &ScanArgs<'_>, h: usize, start: usize, len: usize, state: &mut [f32], y: SyncPtr) -> u64 {
    scan_head_body::<false>(a, h, start, len, state, y)
}

/// The scan of one head with ggml's AVX-512 build's rounding: the state update as separate
/// multiplies and an add, `y = Σ state·C` in four 16-lane FMA accumulators over 64-wide
/// steps folded by [`fold_lanes`], the remainder with scalar FMAs. A step whose f32 result
/// is not finite is recomputed in f64 from the previous state; state values beyond f32
/// range saturate at ±f32::MAX and are counted (the non-finite metric).
#[inline(always)]
unsafe fn scan_head_body<const WIDE: bool>(a: &ScanArgs<'_>, h: usize, start: usize, len: usize, state: &mut [f32], y: SyncPtr) -> u64 {
    let p = a.p;
    let (hd, ds, cd, dp) = (p.head_dim(), p.d_state, p.conv_dim(), p.d_in_proj());
    let g = h / (p.n_head / p.n_group);
    let np = ds & !63;
    let mut bad = 0;
    let mut prev = vec![0f32; ds];
    for t in start..start + len {
        let row = &a.xbc[t * cd..(t + 1) * cd];
        let b = &row[p.d_inner + g * ds..p.d_inner + (g + 1) * ds];
        let c = &row[p.d_inner + (p.n_group + g) * ds..p.d_inner + (p.n_group + g + 1) * ds];
        let raw = a.zxbcdt[t * dp + dp - p.n_head + h] + a.dt_bias[h];
        let dt = softplus(raw);
        let da = (dt * a.a[h]).exp();
        for i in 0..hd {
            let x = row[h * hd + i];
            let xdt = x * dt;
            let s = &mut state[i * ds..(i + 1) * ds];
            prev.copy_from_slice(s);
            let acc = if WIDE {
                lanes_avx512(&mut s[..np], &b[..np], &c[..np], da, xdt)
            } else {
                lanes_scalar(&mut s[..np], &b[..np], &c[..np], da, xdt)
            };
            let mut sum = fold_lanes(&acc);
            for k in np..ds {
                let v = s[k] * da + b[k] * xdt;
                sum = v.mul_add(c[k], sum);
                s[k] = v;
            }
            let mut yv = sum + x * a.d[h];
            if !yv.is_finite() {
                // an f32 overflow or inf*0 in this step: redo it in f64 from the previous state
                let raw64 = raw as f64;
                let dt64 = if raw64 > 20.0 { raw64 } else { raw64.exp().ln_1p() };
                let (x64, da64) = (x as f64, (dt64 * a.a[h] as f64).exp());
                let mut sum64 = 0f64;
                let mut saturated = 0;
                for k in 0..ds {
                    // a fully decayed state contributes nothing, even one saturated earlier
                    let decayed = if da64 == 0.0 { 0.0 } else { prev[k] as f64 * da64 };
                    let v = decayed + b[k] as f64 * (x64 * dt64);
                    sum64 += v * c[k] as f64;
                    // beyond f32 range the state saturates (and is counted), never inf
                    let vf = v as f32;
                    if vf.is_infinite() {
                        saturated += 1;
                    }
                    s[k] = if v.is_nan() { vf } else { vf.clamp(-f32::MAX, f32::MAX) };
                }
                yv = (sum64 + x64 * a.d[h] as f64) as f32;
                bad += saturated + s.iter().filter(|v| v.is_nan()).count() as u64 + u64::from(!yv.is_finite());
            }
            y.write(t * p.d_inner + h * hd + i, yv);
        }
    }
    bad
}

pub(crate) fn ssm_scan(
    be: &CpuBackend,
    kv: &mut CpuKv,
    layer: usize,
    args: &ScanArgs<'_>,
    batch: &ForwardBatch,
    y: &mut [f32],
) -> Result<u64> {
    let p = args.p;
    let n = batch.n_tokens();
    if args.xbc.len() != n * p.conv_dim()
        || args.zxbcdt.len() != n * p.d_in_proj()
        || y.len() != n * p.d_inner
        || [args.a.len(), args.d.len(), args.dt_bias.len()] != [p.n_head; 3]
    {
        return Err(CoreError::Shape(format!("ssm_scan: shapes do not match {p:?} for {n} tokens")));
    }
    let st = state_mut(kv)?;
    let seqs = seq_slots(st, layer, p, batch)?;
    let sl = p.ssm_state_len();
    let hsl = p.head_dim() * p.d_state;
    let states = &mut st.ssm[layer];
    for &(slot, _, _, fresh) in &seqs {
        if fresh {
            states[slot * sl..(slot + 1) * sl].fill(0.0);
        }
    }
    let mut seen = vec![false; st.spec.n_slots];
    for &(slot, ..) in &seqs {
        if std::mem::replace(&mut seen[slot], true) {
            return Err(CoreError::Shape(format!("state slot {slot} used by two sequences of one batch")));
        }
    }
    let sp = states.as_mut_ptr() as usize;
    let yp = SyncPtr(y.as_mut_ptr());
    let bad = AtomicU64::new(0);
    let nh = p.n_head;
    be.for_each_task(seqs.len() * nh, &|task| {
        let (si, h) = (task / nh, task % nh);
        let (slot, start, len, _) = seqs[si];
        // SAFETY: (slot, head) state regions are disjoint across tasks (slots are distinct per
        // batch, checked above); y cells (token of this sequence, head h) likewise.
        let state = unsafe { std::slice::from_raw_parts_mut((sp as *mut f32).add(slot * sl + h * hsl), hsl) };
        let b = unsafe { scan_head(args, h, start, len, state, yp) };
        bad.fetch_add(b, Ordering::Relaxed);
    });
    let bad = bad.into_inner();
    st.non_finite.fetch_add(bad, Ordering::Relaxed);
    Ok(bad)
}

pub(crate) fn ssm_gated_norm(be: &CpuBackend, p: &SsmParams, y: &[f32], zxbcdt: &[f32], w: &[f32], out: &mut [f32]) -> Result<()> {
    let (di, dp) = (p.d_inner, p.d_in_proj());
    let n = y.len() / di;
    if y.len() != n * di || zxbcdt.len() != n * dp || w.len() != di || out.len() != y.len() {
        return Err(CoreError::Shape(format!("ssm_gated_norm: shapes do not match {p:?}")));
    }
    let gs = di / p.n_group;
    let body = |t: usize, o: &mut [f32]| {
        for g in 0..p.n_group {
            let r = g * gs..(g + 1) * gs;
            let og = &mut o[r.clone()];
            for (i, v) in og.iter_mut().enumerate() {
                *v = crate::ggml_math::silu_ggml(zxbcdt[t * dp + g * gs + i]) * y[t * di + g * gs + i];
            }
            let ss: f64 = og.iter().map(|&v| (v * v) as f64).sum();
            let scale = 1.0 / ((ss / gs as f64) as f32 + p.eps).sqrt();
            for (v, &wg) in og.iter_mut().zip(&w[r]) {
                *v = (*v * scale) * wg;
            }
        }
    };
    if n >= 8 {
        be.par_chunks_mut(out, di, &|t, o| body(t, o));
    } else {
        out.chunks_mut(di).enumerate().for_each(|(t, o)| body(t, o));
    }
    Ok(())
}
