//! Element-wise and row-wise ops: embedding, RMSNorm, RoPE, SwiGLU.

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

/// ggml's rms_norm (sum of squares in f64), then multiplied by the weight.
pub(crate) fn rms_norm(be: &CpuBackend, x: &[f32], w: &CpuWeight, eps: f32, out: &mut [f32]) -> Result<()> {
    let g = w.as_f32()?;
    let d = g.len();
    if x.len() % d != 0 {
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
    if x.len() / d >= 8 {
        be.par_chunks_mut(out, d, &|i, or| body((&x[i * d..(i + 1) * d], or)));
    } else {
        x.chunks(d).zip(out.chunks_mut(d)).for_each(body);
    }
    Ok(())
}

/// Rotation angles for one position, computed as ggml does (theta multiplied step by step).
fn rope_cache(pos: u32, p: &RopeParams, cache: &mut [(f32, f32)]) {
    let theta_scale = p.freq_base.powf(-2.0 / p.n_rot as f32);
    let mut theta = pos as f32;
    for (i, c) in cache.iter_mut().enumerate() {
        let ff = p.freq_factors.as_ref().map_or(1.0, |f| f[i]);
        let t = p.freq_scale * (theta / ff);
        *c = (t.cos(), t.sin());
        theta *= theta_scale;
    }
}

/// Most rotated dimensions per head.
const MAX_ROT: usize = 1024;

/// Positions below this have their angles memoized per thread (a decode step rotates q and k
/// of every layer at the same position: the sines and cosines are computed once, not 2 x
/// n_layer times; prompts reuse them across layers too).
const MEMO_POSITIONS: usize = 8192;

/// This thread's angle tables: `(n_rot, freq_base, freq_scale, freq_factors)` they belong to,
/// then `n_rot / 2` pairs per position and whether a position is filled.
#[derive(Default)]
struct RopeMemo {
    key: Option<(usize, u32, u32, Option<Vec<f32>>)>,
    table: Vec<(f32, f32)>,
    filled: Vec<bool>,
}

thread_local! {
    static ROPE_MEMO: std::cell::RefCell<RopeMemo> = std::cell::RefCell::new(RopeMemo::default());
}

/// `f` on the angles of `pos` (the values [`rope_cache`] computes, memoized per thread).
fn with_angles<R>(pos: u32, p: &RopeParams, f: impl FnOnce(&[(f32, f32)]) -> R) -> R {
    let half = p.n_rot / 2;
    if pos as usize >= MEMO_POSITIONS {
        return with_fresh_angles(pos, p, f);
    }
    ROPE_MEMO.with(|m| {
        let Ok(mut m) = m.try_borrow_mut() else { return with_fresh_angles(pos, p, f) };
        let same = matches!(&m.key, Some((n, b, s, ff)) if *n == p.n_rot && *b == p.freq_base.to_bits()
            && *s == p.freq_scale.to_bits() && ff.as_deref() == p.freq_factors.as_deref().map(|v| &v[..half]));
        if !same {
            m.key = Some((p.n_rot, p.freq_base.to_bits(), p.freq_scale.to_bits(), p.freq_factors.as_ref().map(|v| v[..half].to_vec())));
            m.filled.clear();
        }
        let pos = pos as usize;
        if m.filled.len() <= pos {
            let n = (pos + 1).next_power_of_two().min(MEMO_POSITIONS);
            m.filled.resize(n, false);
            m.table.resize(n * half, (0.0, 0.0));
        }
        let RopeMemo { table, filled, .. } = &mut *m;
        let angles = &mut table[pos * half..(pos + 1) * half];
        if !filled[pos] {
            rope_cache(pos as u32, p, angles);
            filled[pos] = true;
        }
        f(angles)
    })
}

/// `f` on the angles of `pos`, computed on the stack.
fn with_fresh_angles<R>(pos: u32, p: &RopeParams, f: impl FnOnce(&[(f32, f32)]) -> R) -> R {
    let mut cache = [(0f32, 0f32); MAX_ROT / 2];
    let cache = &mut cache[..p.n_rot / 2];
    rope_cache(pos, p, cache);
    f(cache)
}

pub(crate) fn rope(be: &CpuBackend, x: &mut [f32], positions: &[u32], n_head: usize, hd: usize, p: &RopeParams) -> Result<()> {
    if p.n_rot > hd || p.n_rot % 2 != 0 || p.n_rot > MAX_ROT {
        return Err(CoreError::Shape(format!("rope: n_rot {} vs head_dim {hd}", p.n_rot)));
    }
    if let Some(f) = &p.freq_factors {
        if f.len() < p.n_rot / 2 {
            return Err(CoreError::Shape(format!("rope: {} freq factors for n_rot {}", f.len(), p.n_rot)));
        }
    }
    let row = n_head * hd;
    let body = |(t, xr): (usize, &mut [f32])| {
        with_angles(positions[t], p, |cache| {
            for h in xr.chunks_mut(hd) {
                match p.style {
                    RopeStyle::Normal => {
                        for (i, &(c, s)) in cache.iter().enumerate() {
                            let (a, b) = (h[2 * i], h[2 * i + 1]);
                            // ggml's `x0*cos - x1*sin`, `x0*sin + x1*cos`, FMA-contracted by its compiler
                            h[2 * i] = a.mul_add(c, -(b * s));
                            h[2 * i + 1] = a.mul_add(s, b * c);
                        }
                    }
                    RopeStyle::Neox => {
                        let half = p.n_rot / 2;
                        for (i, &(c, s)) in cache.iter().enumerate() {
                            let (a, b) = (h[i], h[i + half]);
                            h[i] = a.mul_add(c, -(b * s));
                            h[i + half] = a.mul_add(s, b * c);
                        }
                    }
                }
            }
        })
    };
    if positions.len() >= 8 {
        be.par_chunks_mut(x, row, &|i, xr| body((i, xr)));
    } else {
        x.chunks_mut(row).enumerate().for_each(body);
    }
    Ok(())
}

pub(crate) fn swiglu(be: &CpuBackend, gate: &[f32], up: &[f32], out: &mut [f32]) {
    const CHUNK: usize = 1 << 14;
    if out.len() >= 4 * CHUNK {
        be.par_chunks_mut(out, CHUNK, &|i, o| {
            let r = i * CHUNK..i * CHUNK + o.len();
            crate::ggml_math::swiglu(&gate[r.clone()], &up[r], o)
        });
    } else {
        crate::ggml_math::swiglu(gate, up, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(base: f32, scale: f32, factors: Option<Vec<f32>>) -> RopeParams {
        RopeParams { style: RopeStyle::Normal, n_rot: 8, freq_base: base, freq_scale: scale, freq_factors: factors }
    }

    /// The per-thread memo gives exactly the freshly computed angles, also when the
    /// parameters change between calls (another model, or layers with other settings).
    #[test]
    fn memoized_angles_equal_fresh_ones() {
        let sets = [
            params(10000.0, 1.0, None),
            params(500000.0, 1.0, None),
            params(10000.0, 0.25, None),
            params(10000.0, 1.0, Some(vec![1.0, 2.0, 4.0, 8.0])),
            params(10000.0, 1.0, Some(vec![1.0, 2.0, 4.0, 16.0])),
        ];
        for round in 0..2 {
            for p in sets.iter().chain(sets.iter().rev()) {
                for pos in [0u32, 1, 7, 300, 8191, 8192, 20000] {
                    let memo = with_angles(pos, p, |a| a.to_vec());
                    let fresh = with_fresh_angles(pos, p, |a| a.to_vec());
                    assert_eq!(memo, fresh, "round {round} pos {pos}");
                }
            }
        }
    }
}
