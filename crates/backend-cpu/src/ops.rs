//! Element-wise and row-wise ops: embedding, RMSNorm, LayerNorm, RoPE, SwiGLU.

use crate::{CpuBackend, CpuWeight};
use quarrel_core::{CoreError, Result, RopeParams, RopeStyle};

pub(crate) fn embed(table: &CpuWeight, tokens: &[u32], out: &mut [f32]) -> Result<()> {
    let d = table.n_in;
    if out.len() != tokens.len() * d {
        return Err(CoreError::Shape(format!("embed output {} != {} x {d}", out.len(), tokens.len())));
    }
    for (i, &t) in tokens.iter().enumerate() {
        if t as usize >= table.n_out {
            return Err(CoreError::Model(format!("token id {t} is outside the vocabulary of {}", table.n_out)));
        }
        quarrel_quant::dequantize(table.ty, table.row(t as usize), &mut out[i * d..(i + 1) * d])?;
    }
    Ok(())
}

/// RMSNorm runs in parallel from this many values (rows x width) on.
const PAR_MIN_VALUES: usize = 1 << 16;
/// RoPE runs in parallel from this many tokens on (each computes its own angle table).
const ROPE_PAR_MIN_TOKENS: usize = 32;
/// With a pool of 2+ threads, RMSNorm and RoPE also run in parallel from this many rows (a
/// decode step of many sequences: a parallel region costs well under a microsecond while
/// the pool's threads are awake, the rows several; one sequence's step stays on the caller).
const PAR_MIN_ROWS: usize = 8;

/// ggml's rms_norm (sum of squares in f64), then multiplied by the weight.
pub(crate) fn rms_norm(be: &CpuBackend, x: &[f32], w: &CpuWeight, eps: f32, out: &mut [f32]) -> Result<()> {
    let g = w.as_f32()?;
    let d = g.len();
    if !x.len().is_multiple_of(d) {
        return Err(CoreError::Shape(format!("rms_norm: {} values are not rows of {d}", x.len())));
    }
    let body = |(xr, or): (&[f32], &mut [f32])| {
        // ggml: float products, summed in double
        let ss: f64 = xr.iter().map(|&v| (v * v) as f64).sum();
        let mean = (ss / d as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, &v), &gw) in or.iter_mut().zip(xr).zip(g) {
            *o = (v * scale) * gw;
        }
    };
    // a parallel region costs a wake-up and a barrier: worth it for prompt batches, not for a
    // decode step's few rows
    if x.len() >= PAR_MIN_VALUES || (be.n_threads() > 1 && x.len() / d >= PAR_MIN_ROWS) {
        be.par_chunks_mut(out, d, &|i, or| body((&x[i * d..(i + 1) * d], or)));
    } else {
        x.chunks(d).zip(out.chunks_mut(d)).for_each(body);
    }
    Ok(())
}

/// ggml's `norm` as its AVX-512 build computes it, then `mul` by `w` and `add` of `b` (each
/// rounded in f32): the mean summed in f64; the variance of the centered row summed over
/// 16-value blocks, each block's float squares reduced pairwise (halves, quarters, ...: the
/// order of `_mm512_reduce_add_ps`) and the block sums added in f64, the tail value by value.
pub(crate) fn layer_norm(be: &CpuBackend, x: &[f32], w: &CpuWeight, b: &CpuWeight, eps: f32, out: &mut [f32]) -> Result<()> {
    let (g, bias) = (w.as_f32()?, b.as_f32()?);
    let d = g.len();
    if bias.len() != d || !x.len().is_multiple_of(d) {
        return Err(CoreError::Shape(format!("layer_norm: {} values, weight {d}, bias {}", x.len(), bias.len())));
    }
    let body = |(xr, or): (&[f32], &mut [f32])| {
        let sum: f64 = xr.iter().map(|&v| v as f64).sum();
        let mean = sum as f32 / d as f32;
        let mut acc = 0f64;
        let blocks = d / 16;
        for blk in xr[..blocks * 16].chunks_exact(16) {
            let mut p = [0f32; 16];
            for (q, &v) in p.iter_mut().zip(blk) {
                let c = v - mean;
                *q = c * c;
            }
            let mut h = [0f32; 8];
            for j in 0..8 {
                h[j] = p[j + 8] + p[j];
            }
            let q4 = [h[4] + h[0], h[5] + h[1], h[6] + h[2], h[7] + h[3]];
            acc += ((q4[0] + q4[2]) + (q4[1] + q4[3])) as f64;
        }
        for &v in &xr[blocks * 16..] {
            let c = v - mean;
            acc += (c * c) as f64;
        }
        let variance = (acc / d as f64) as f32;
        let scale = 1.0 / (variance + eps).sqrt();
        for ((o, &v), (&gw, &bw)) in or.iter_mut().zip(xr).zip(g.iter().zip(bias)) {
            *o = ((v - mean) * scale) * gw + bw;
        }
    };
    if x.len() >= PAR_MIN_VALUES || (be.n_threads() > 1 && x.len() / d >= PAR_MIN_ROWS) {
        be.par_chunks_mut(out, d, &|i, or| body((&x[i * d..(i + 1) * d], or)));
    } else {
        x.chunks(d).zip(out.chunks_mut(d)).for_each(body);
    }
    Ok(())
}

/// Rotation angles for one position, computed as ggml does (theta multiplied step by step;
/// YaRN's blend and the magnitude as `RopeScaling` says).
fn rope_cache(pos: u32, p: &RopeParams, cache: &mut [(f32, f32)]) {
    let theta_scale = p.freq_base.powf(-2.0 / p.n_rot as f32);
    let mscale = p.scaling.mscale(p.freq_scale);
    let mut theta = pos as f32;
    for (i, c) in cache.iter_mut().enumerate() {
        let ff = p.freq_factors.as_ref().map_or(1.0, |f| f[i]);
        let t = p.scaling.angle(theta / ff, p.freq_scale, i);
        *c = (t.cos() * mscale, t.sin() * mscale);
        theta *= theta_scale;
    }
}

/// Most rotated dimensions per head (the angle cache lives on the stack).
const MAX_ROT: usize = 1024;

pub(crate) fn rope(be: &CpuBackend, x: &mut [f32], positions: &[u32], n_head: usize, hd: usize, p: &RopeParams) -> Result<()> {
    if p.n_rot > hd || !p.n_rot.is_multiple_of(2) || p.n_rot > MAX_ROT {
        return Err(CoreError::Shape(format!("rope: n_rot {} vs head_dim {hd}", p.n_rot)));
    }
    if let Some(f) = &p.freq_factors {
        if f.len() < p.n_rot / 2 {
            return Err(CoreError::Shape(format!("rope: {} freq factors for n_rot {}", f.len(), p.n_rot)));
        }
    }
    let row = n_head * hd;
    let body = |(t, xr): (usize, &mut [f32])| {
        let mut cache = [(0f32, 0f32); MAX_ROT / 2];
        let cache = &mut cache[..p.n_rot / 2];
        rope_cache(positions[t], p, cache);
        rotate_heads(p.style, cache, xr, hd);
    };
    if positions.len() >= ROPE_PAR_MIN_TOKENS || (be.n_threads() > 1 && positions.len() >= PAR_MIN_ROWS) {
        be.par_chunks_mut(x, row, &|i, xr| body((i, xr)));
    } else {
        x.chunks_mut(row).enumerate().for_each(body);
    }
    Ok(())
}

fma_dispatch! {
    /// Rotate every head (`hd` values) of `xr` by the angles in `cache`.
    fn rotate_heads(style: RopeStyle, cache: &[(f32, f32)], xr: &mut [f32], hd: usize) => rotate_heads_impl
}

#[inline(always)]
fn rotate_heads_impl(style: RopeStyle, cache: &[(f32, f32)], xr: &mut [f32], hd: usize) {
    for h in xr.chunks_mut(hd) {
        match style {
            RopeStyle::Normal => {
                for (i, &(c, s)) in cache.iter().enumerate() {
                    let (a, b) = (h[2 * i], h[2 * i + 1]);
                    // ggml's `x0*cos - x1*sin`, `x0*sin + x1*cos`, FMA-contracted by its compiler
                    h[2 * i] = a.mul_add(c, -(b * s));
                    h[2 * i + 1] = a.mul_add(s, b * c);
                }
            }
            RopeStyle::Neox => {
                let half = cache.len();
                for (i, &(c, s)) in cache.iter().enumerate() {
                    let (a, b) = (h[i], h[i + half]);
                    h[i] = a.mul_add(c, -(b * s));
                    h[i + half] = a.mul_add(s, b * c);
                }
            }
        }
    }
}

pub(crate) fn swiglu(be: &CpuBackend, gate: &[f32], up: &[f32], out: &mut [f32]) {
    // chunks of a multiple of 16 values: the SIMD kernel takes 16 at a time and the scalar
    // tail only the whole buffer's last values, as on one thread (the same bits)
    const CHUNK: usize = 1 << 14;
    const SMALL_CHUNK: usize = 1 << 11;
    let chunk = if out.len() >= 4 * CHUNK { CHUNK } else { SMALL_CHUNK };
    if out.len() >= 4 * CHUNK || (be.n_threads() > 1 && out.len() >= 4 * SMALL_CHUNK) {
        be.par_chunks_mut(out, chunk, &|i, o| {
            let r = i * chunk..i * chunk + o.len();
            crate::ggml_math::swiglu(&gate[r.clone()], &up[r], o)
        });
    } else {
        crate::ggml_math::swiglu(gate, up, out);
    }
}

/// `out = gelu(gate) * up` through llama.cpp's f16 GELU table (element-wise: any split gives
/// the same bits).
pub(crate) fn swiglu_oai(be: &CpuBackend, gate: &[f32], up: &[f32], out: &mut [f32], alpha: f32, limit: f32) {
    const CHUNK: usize = 1 << 13;
    if be.n_threads() > 1 && out.len() >= 4 * CHUNK {
        be.par_chunks_mut(out, CHUNK, &|i, o| {
            let r = i * CHUNK..i * CHUNK + o.len();
            quarrel_core::act::swiglu_oai_ref(&gate[r.clone()], &up[r], o, alpha, limit)
        });
    } else {
        quarrel_core::act::swiglu_oai_ref(gate, up, out, alpha, limit);
    }
}

pub(crate) fn geglu(be: &CpuBackend, gate: &[f32], up: &[f32], out: &mut [f32]) {
    const CHUNK: usize = 1 << 13;
    if be.n_threads() > 1 && out.len() >= 4 * CHUNK {
        be.par_chunks_mut(out, CHUNK, &|i, o| {
            let r = i * CHUNK..i * CHUNK + o.len();
            quarrel_core::act::geglu_ref(&gate[r.clone()], &up[r], o)
        });
    } else {
        quarrel_core::act::geglu_ref(gate, up, out);
    }
}
