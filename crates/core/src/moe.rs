//! Mixture-of-experts routing: parameters and the host reference of the router
//! (`softmax | sigmoid | identity` -> optional selection bias -> top-k -> a softmax over the
//! chosen logits where the gating says so -> optional renormalization -> optional scale), with
//! llama.cpp's `build_moe_ffn` semantics.

use crate::{CoreError, Result};

/// How router logits become expert probabilities (`{arch}.expert_gating_func`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    Softmax,
    Sigmoid,
    /// The experts chosen by their raw logits, weighted by a softmax over the chosen logits
    /// only (GPT-OSS).
    SoftmaxWeight,
}

impl Gating {
    /// llama.cpp's `llama_expert_gating_func_type` id (1 = softmax, 2 = sigmoid, 3 = softmax
    /// over the chosen experts' logits).
    pub fn from_gguf(id: u64) -> Result<Gating> {
        match id {
            1 => Ok(Gating::Softmax),
            2 => Ok(Gating::Sigmoid),
            3 => Ok(Gating::SoftmaxWeight),
            other => Err(CoreError::Unsupported(format!(
                "expert gating function {other} (supported: 1 softmax, 2 sigmoid, 3 softmax over the chosen)"
            ))),
        }
    }
}

/// Router options of one MoE layer.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeRouting {
    pub n_expert: usize,
    /// Experts per token (`expert_used_count`).
    pub n_used: usize,
    pub gating: Gating,
    /// Divide the chosen weights by their sum (`expert_weights_norm`).
    pub norm_weights: bool,
    /// Multiply the weights by this (`expert_weights_scale`; 0 or 1 = none).
    pub scale: f32,
}

/// One token's use of one expert.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Route {
    pub token: u32,
    pub expert: u32,
    pub weight: f32,
}

/// Route `n_tok` rows of `logits (n_tok, n_expert)`: for each token its `n_used` experts in
/// descending order of (probability + `bias`), weighted by the unbiased probability. Routes
/// come token-major.
pub fn route_reference(logits: &[f32], bias: Option<&[f32]>, p: &MoeRouting) -> Result<Vec<Route>> {
    route_with(logits, bias, p, &softmax_reference)
}

/// Plain softmax of one row: `exp(x - max)` summed in f64, scaled by `1/sum` in f32.
pub fn softmax_reference(row: &[f32], out: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for (o, &v) in out.iter_mut().zip(row) {
        *o = (v - max).exp();
        sum += *o as f64;
    }
    let inv = (1.0 / sum) as f32;
    out.iter_mut().for_each(|o| *o *= inv);
}

/// The checks every router makes on its inputs: `n_used` of `n_expert` experts, logits in rows
/// of `n_expert`, a bias of `n_expert` values. Returns the number of tokens.
pub fn check_route_args(logits: &[f32], bias: Option<&[f32]>, p: &MoeRouting) -> Result<usize> {
    let ne = p.n_expert;
    if ne == 0 || p.n_used == 0 || p.n_used > ne {
        return Err(CoreError::Model(format!("MoE routing: {} of {ne} experts per token", p.n_used)));
    }
    if !logits.len().is_multiple_of(ne) {
        return Err(CoreError::Shape(format!("router logits: {} values are not rows of {ne}", logits.len())));
    }
    if let Some(b) = bias {
        if b.len() != ne {
            return Err(CoreError::Shape(format!("expert bias has {} values, expected {ne}", b.len())));
        }
    }
    Ok(logits.len() / ne)
}

/// The router with a backend's own softmax (`softmax(row, out)`); everything else as
/// [`route_reference`].
pub fn route_with(logits: &[f32], bias: Option<&[f32]>, p: &MoeRouting, softmax: &dyn Fn(&[f32], &mut [f32])) -> Result<Vec<Route>> {
    let ne = p.n_expert;
    check_route_args(logits, bias, p)?;
    let mut out = Vec::with_capacity(logits.len() / ne * p.n_used);
    let mut probs = vec![0f32; ne];
    let mut order: Vec<usize> = (0..ne).collect();
    for (t, row) in logits.chunks(ne).enumerate() {
        gate_probs(row, p.gating, softmax, &mut probs);
        let sel = |e: usize| probs[e] + bias.map_or(0.0, |b| b[e]);
        order.iter_mut().enumerate().for_each(|(i, o)| *o = i);
        // descending, NaN last, ties by expert index
        order.sort_by(|&a, &b| sel(b).partial_cmp(&sel(a)).unwrap_or_else(|| sel(a).is_nan().cmp(&sel(b).is_nan())).then(a.cmp(&b)));
        let chosen = &order[..p.n_used];
        let w = chosen_weights(chosen, &probs, p, softmax);
        for (&e, &wt) in chosen.iter().zip(&w) {
            out.push(Route { token: t as u32, expert: e as u32, weight: wt });
        }
    }
    Ok(out)
}

/// One token's expert probabilities from its router logits `row`, as `gating` computes them
/// (the softmax by `softmax`; [`Gating::SoftmaxWeight`]: the logits themselves).
pub fn gate_probs(row: &[f32], gating: Gating, softmax: &dyn Fn(&[f32], &mut [f32]), probs: &mut [f32]) {
    match gating {
        Gating::Softmax => softmax(row, probs),
        Gating::Sigmoid => {
            for (o, &v) in probs.iter_mut().zip(row) {
                *o = 1.0 / (1.0 + (-v).exp());
            }
        }
        Gating::SoftmaxWeight => probs.copy_from_slice(row),
    }
}

/// The weights of the `chosen` experts (in pick order): their probabilities (with
/// [`Gating::SoftmaxWeight`], the softmax by `softmax` of their logits, as ggml_soft_max over
/// the gathered rows), divided by their sum where `p` renormalizes, then multiplied by
/// `p.scale`.
pub fn chosen_weights(chosen: &[usize], probs: &[f32], p: &MoeRouting, softmax: &dyn Fn(&[f32], &mut [f32])) -> Vec<f32> {
    let mut w: Vec<f32> = chosen.iter().map(|&e| probs[e]).collect();
    if p.gating == Gating::SoftmaxWeight {
        let picked = w.clone();
        softmax(&picked, &mut w);
    }
    if p.norm_weights {
        // ggml_sum_rows sums in f64; the clamp keeps a zero sum finite
        let s = (w.iter().map(|&x| x as f64).sum::<f64>() as f32).max(6.103_515_6e-5);
        w.iter_mut().for_each(|x| *x /= s);
    }
    if p.scale != 0.0 && p.scale != 1.0 {
        w.iter_mut().for_each(|x| *x *= p.scale);
    }
    w
}

/// Routes grouped by expert: `(expert, route indices)` in expert order, route order kept;
/// an error for a route to an expert at or past `n_expert`.
pub fn group_by_expert(routes: &[Route], n_expert: usize) -> Result<Vec<(usize, Vec<usize>)>> {
    let mut per: Vec<Vec<usize>> = vec![Vec::new(); n_expert];
    for (i, r) in routes.iter().enumerate() {
        let e = r.expert as usize;
        if e >= n_expert {
            return Err(CoreError::Shape(format!("route to expert {e} of {n_expert}")));
        }
        per[e].push(i);
    }
    Ok(per.into_iter().enumerate().filter(|(_, v)| !v.is_empty()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_top2_renormalized() {
        let p = MoeRouting { n_expert: 4, n_used: 2, gating: Gating::Softmax, norm_weights: true, scale: 0.0 };
        let r = route_reference(&[0.0, 2.0, 1.0, -1.0], None, &p).unwrap();
        assert_eq!(r.iter().map(|r| r.expert).collect::<Vec<_>>(), vec![1, 2]);
        let (a, b) = (1f32.exp(), 1.0f32);
        assert!((r[0].weight - a / (a + b)).abs() < 1e-6);
        assert!((r[0].weight + r[1].weight - 1.0).abs() < 1e-6);
    }

    #[test]
    fn bias_changes_choice_not_weight() {
        let p = MoeRouting { n_expert: 3, n_used: 1, gating: Gating::Sigmoid, norm_weights: false, scale: 2.0 };
        let r = route_reference(&[1.0, 0.0, 0.5], Some(&[0.0, 1.0, 0.0]), &p).unwrap();
        assert_eq!(r[0].expert, 1);
        assert!((r[0].weight - 2.0 * 0.5).abs() < 1e-6);
    }

    #[test]
    fn softmax_weight_softmaxes_the_chosen_logits() {
        let p = MoeRouting { n_expert: 4, n_used: 2, gating: Gating::SoftmaxWeight, norm_weights: false, scale: 0.0 };
        let r = route_reference(&[0.5, 3.0, -1.0, 2.0], None, &p).unwrap();
        assert_eq!(r.iter().map(|r| r.expert).collect::<Vec<_>>(), vec![1, 3]);
        // softmax over (3, 2) only: the unchosen logits do not enter the denominator
        let w0 = 1.0 / (1.0 + (-1f32).exp());
        assert!((r[0].weight - w0).abs() < 1e-6, "{r:?}");
        assert!((r[0].weight + r[1].weight - 1.0).abs() < 1e-6);
        assert_eq!(Gating::from_gguf(3).unwrap(), Gating::SoftmaxWeight);
    }

    #[test]
    fn bad_shapes_are_errors() {
        let p = MoeRouting { n_expert: 3, n_used: 4, gating: Gating::Softmax, norm_weights: false, scale: 0.0 };
        assert!(route_reference(&[0.0; 3], None, &p).is_err());
        let p = MoeRouting { n_used: 1, ..p };
        assert!(route_reference(&[0.0; 4], None, &p).is_err());
    }
}
