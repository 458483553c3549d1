//! Mixture-of-experts ops: routing (the core reference router), the grouped expert matmul
//! (per expert: gather its rows, one quantized matmul over a zero-copy view of its slice of
//! the 3-D tensor, scatter back) and the weighted combine.

use crate::ggml_math::{expf_ggml, reduce16};
use crate::{matmul, CpuBackend, CpuWeight};
use quarrel_core::{CoreError, MoeRouting, Result, Route};

/// Softmax as ggml's AVX-512 build computes it (`ggml_vec_soft_max_f32`): 16-wide chunks of
/// `ggml_v_expf` whose lane sums (reduce tree) accumulate in f64, the remainder with libm
/// `expf`; then scaled by `1/sum` in f32.
pub fn softmax_ggml(row: &[f32], out: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let n = row.len();
    let n16 = n & !15;
    let mut sum = 0f64;
    for i in (0..n16).step_by(16) {
        let mut lanes = [0f32; 16];
        for l in 0..16 {
            lanes[l] = expf_ggml(row[i + l] - max);
            out[i + l] = lanes[l];
        }
        sum += reduce16(&lanes) as f64;
    }
    for i in n16..n {
        out[i] = (row[i] - max).exp();
        sum += out[i] as f64;
    }
    let inv = (1.0 / sum) as f32;
    out.iter_mut().for_each(|o| *o *= inv);
}

pub(crate) fn moe_route(logits: &[f32], bias: Option<&[f32]>, p: &MoeRouting) -> Result<Vec<Route>> {
    quarrel_core::moe::route_with(logits, bias, p, &softmax_ggml)
}

pub(crate) fn moe_matmul(
    be: &CpuBackend,
    w: &CpuWeight,
    n_expert: usize,
    x: &[f32],
    routes: &[Route],
    x_per_token: bool,
    out: &mut [f32],
) -> Result<()> {
    let n_in = w.n_in;
    if n_expert == 0 || !w.n_out.is_multiple_of(n_expert) {
        return Err(CoreError::Shape(format!("moe_matmul: {} rows are not {n_expert} experts", w.n_out)));
    }
    let n_out = w.n_out / n_expert;
    if out.len() != routes.len() * n_out {
        return Err(CoreError::Shape(format!("moe_matmul output: {} values, expected {}", out.len(), routes.len() * n_out)));
    }
    let n_src = x.len() / n_in.max(1);
    if !x.len().is_multiple_of(n_in) || (!x_per_token && n_src != routes.len()) {
        return Err(CoreError::Shape(format!("moe_matmul input: {} values for {} routes of {n_in}", x.len(), routes.len())));
    }
    let mut xs: Vec<f32> = Vec::new();
    let mut ys: Vec<f32> = Vec::new();
    for (e, idx) in quarrel_core::moe::group_by_expert(routes, n_expert)? {
        let view = w.expert(e, n_expert)?;
        xs.clear();
        for &i in &idx {
            let src = if x_per_token { routes[i].token as usize } else { i };
            let row =
                x.get(src * n_in..(src + 1) * n_in).ok_or_else(|| CoreError::Shape(format!("moe_matmul: input row {src} of {n_src}")))?;
            xs.extend_from_slice(row);
        }
        ys.clear();
        ys.resize(idx.len() * n_out, 0.0);
        matmul::matmul(be, &view, &xs, idx.len(), &mut ys)?;
        for (j, &i) in idx.iter().enumerate() {
            out[i * n_out..(i + 1) * n_out].copy_from_slice(&ys[j * n_out..(j + 1) * n_out]);
        }
    }
    Ok(())
}

pub(crate) fn moe_combine(y: &[f32], routes: &[Route], out: &mut [f32]) -> Result<()> {
    if routes.is_empty() {
        return Ok(());
    }
    if !y.len().is_multiple_of(routes.len()) {
        return Err(CoreError::Shape(format!("moe_combine: {} values for {} routes", y.len(), routes.len())));
    }
    let d = y.len() / routes.len();
    for (i, r) in routes.iter().enumerate() {
        let t = r.token as usize;
        let o = out.get_mut(t * d..(t + 1) * d).ok_or_else(|| CoreError::Shape(format!("moe_combine: token {t} out of range")))?;
        for (a, &b) in o.iter_mut().zip(&y[i * d..(i + 1) * d]) {
            *a += b * r.weight;
        }
    }
    Ok(())
}

/// `y (routes, width) += bias[expert]` per route, `bias (n_expert, width)`.
pub(crate) fn moe_add_bias(y: &mut [f32], bias: &[f32], routes: &[Route]) -> Result<()> {
    if routes.is_empty() {
        return Ok(());
    }
    if !y.len().is_multiple_of(routes.len()) {
        return Err(CoreError::Shape(format!("moe_add_bias: {} values for {} routes", y.len(), routes.len())));
    }
    let d = y.len() / routes.len();
    for (row, r) in y.chunks_exact_mut(d).zip(routes) {
        let e = r.expert as usize;
        let b = bias.get(e * d..(e + 1) * d).ok_or_else(|| CoreError::Shape(format!("moe_add_bias: no bias row for expert {e}")))?;
        row.iter_mut().zip(b).for_each(|(a, &b)| *a += b);
    }
    Ok(())
}

/// Plain twin of `moe_matmul`: each route's row dequantized and dotted in f64.
pub fn moe_matmul_reference(w: &CpuWeight, n_expert: usize, x: &[f32], routes: &[Route], x_per_token: bool) -> Result<Vec<f32>> {
    let n_in = w.n_in;
    let n_out = w.n_out / n_expert;
    let mut out = vec![0f32; routes.len() * n_out];
    let mut row = vec![0f32; n_in];
    for (i, r) in routes.iter().enumerate() {
        let src = if x_per_token { r.token as usize } else { i };
        let xr = &x[src * n_in..(src + 1) * n_in];
        for o in 0..n_out {
            quarrel_quant::dequantize(w.ty, w.row(r.expert as usize * n_out + o), &mut row)?;
            out[i * n_out + o] = row.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() as f32;
        }
    }
    Ok(out)
}
