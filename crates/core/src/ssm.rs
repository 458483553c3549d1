//! Mamba2 (selective state space) layer shapes, the recurrent state a model declares, and
//! the plain reference implementations of the three SSM ops (causal depthwise conv1d with a
//! carried state, selective scan, gated grouped RMSNorm) with ggml's semantics.
//!
//! Input projection row layout (`ssm_in` output, `d_in_proj` wide):
//! `[ z (d_inner) | x (d_inner) | B (n_group*d_state) | C (n_group*d_state) | dt (n_head) ]`;
//! `xBC` (the middle `conv_dim` columns) goes through the conv.
//!
//! State per sequence slot and layer: conv `(conv_dim, d_conv - 1)` (channel-major, oldest
//! first) and ssm `(n_head, head_dim, d_state)`.

/// Shape of one Mamba2 layer (`{arch}.ssm.*`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SsmParams {
    /// `ssm.conv_kernel`.
    pub d_conv: usize,
    /// `ssm.inner_size`.
    pub d_inner: usize,
    /// `ssm.state_size`.
    pub d_state: usize,
    /// `ssm.group_count`.
    pub n_group: usize,
    /// `ssm.time_step_rank` (heads).
    pub n_head: usize,
    /// RMS epsilon of the gated norm.
    pub eps: f32,
}

impl SsmParams {
    pub fn head_dim(&self) -> usize {
        self.d_inner / self.n_head
    }
    /// Channels through the conv: x, B and C.
    pub fn conv_dim(&self) -> usize {
        self.d_inner + 2 * self.n_group * self.d_state
    }
    /// Width of the input projection.
    pub fn d_in_proj(&self) -> usize {
        2 * self.d_inner + 2 * self.n_group * self.d_state + self.n_head
    }
    pub fn conv_state_len(&self) -> usize {
        (self.d_conv - 1) * self.conv_dim()
    }
    pub fn ssm_state_len(&self) -> usize {
        self.d_state * self.d_inner
    }
    /// Check divisibility rules; a clear error for a malformed file.
    pub fn validate(&self) -> Result<(), String> {
        let ok = self.d_conv >= 1
            && self.n_head > 0
            && self.n_group > 0
            && self.d_state > 0
            && self.d_inner.is_multiple_of(self.n_head)
            && self.d_inner.is_multiple_of(self.n_group)
            && self.n_head.is_multiple_of(self.n_group);
        if ok {
            Ok(())
        } else {
            Err(format!("bad SSM shape {self:?}: d_inner must divide into heads and groups, heads into groups"))
        }
    }
}

/// Recurrent state a model asks the engine for: `n_slots` sequence slots, and per layer the
/// SSM shape (None for layers without recurrent state).
#[derive(Clone, Debug, PartialEq)]
pub struct StateSpec {
    pub n_slots: usize,
    pub layers: Vec<Option<SsmParams>>,
}

impl StateSpec {
    /// Bytes of f32 state per sequence slot, over all layers.
    pub fn bytes_per_slot(&self) -> usize {
        self.layers.iter().flatten().map(|p| 4 * (p.conv_state_len() + p.ssm_state_len())).sum()
    }
}

/// `softplus` as ggml computes it.
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// Inputs of the conv for one sequence.
#[derive(Clone, Copy)]
pub struct ConvInputs<'a> {
    /// `(n_t, conv_dim)` rows: `xbc[t * stride + col0 + ch]`.
    pub xbc: &'a [f32],
    pub stride: usize,
    pub col0: usize,
    /// Weight `(conv_dim, d_conv)`.
    pub w: &'a [f32],
    pub bias: Option<&'a [f32]>,
}

/// Reference conv of one sequence: the rows of `inp`, carried `state (conv_dim, d_conv-1)`;
/// writes `silu(conv + bias)` to `out (n_t, conv_dim)` and updates `state`.
pub fn conv_reference(p: &SsmParams, inp: &ConvInputs<'_>, state: &mut [f32], out: &mut [f32]) {
    conv_with(p, inp, state, out, |s, x, w| s + x * w, |_, v| v / (1.0 + (-v).exp()));
}

/// The conv of [`conv_reference`] with its two roundings chosen by the caller: `mac(s, x, w)`
/// adds one window product to the sum `s`, `act(channel, v)` is the SiLU of conv + bias.
#[inline(always)]
pub fn conv_with(
    p: &SsmParams,
    inp: &ConvInputs<'_>,
    state: &mut [f32],
    out: &mut [f32],
    mac: impl Fn(f32, f32, f32) -> f32,
    act: impl Fn(usize, f32) -> f32,
) {
    let ConvInputs { xbc, stride, col0, w, bias } = *inp;
    let (nc, cd) = (p.d_conv, p.conv_dim());
    let n_t = out.len() / cd;
    let mut win = vec![0f32; nc - 1 + n_t];
    for ch in 0..cd {
        win[..nc - 1].copy_from_slice(&state[ch * (nc - 1)..(ch + 1) * (nc - 1)]);
        for t in 0..n_t {
            win[nc - 1 + t] = xbc[t * stride + col0 + ch];
        }
        let wc = &w[ch * nc..(ch + 1) * nc];
        let b = bias.map_or(0.0, |b| b[ch]);
        for t in 0..n_t {
            let mut s = 0f32;
            for i in 0..nc {
                s = mac(s, win[t + i], wc[i]);
            }
            out[t * cd + ch] = act(ch, s + b);
        }
        state[ch * (nc - 1)..(ch + 1) * (nc - 1)].copy_from_slice(&win[n_t..]);
    }
}

/// Inputs of the scan for one sequence (all row-major over its `n_t` tokens).
pub struct ScanInputs<'a> {
    /// Conv output rows `(n_t, conv_dim)`: x, then B, then C.
    pub xbc: &'a [f32],
    /// Raw dt: `dt[t * dt_stride + dt_col + h]` (before the bias).
    pub dt: &'a [f32],
    pub dt_stride: usize,
    pub dt_col: usize,
    /// Per head: A (negative decay rate), D (skip), dt bias.
    pub a: &'a [f32],
    pub d: &'a [f32],
    pub dt_bias: &'a [f32],
}

/// Reference selective scan of heads `h0..h1` of one sequence in f32, ggml's operation order:
/// `s = s*exp(softplus(dt+b)*A) + B*(x*softplus(dt+b))`, `y = s·C + x*D`. `state` is
/// `(n_head, head_dim, d_state)`; `y (n_t, d_inner)`.
pub fn scan_reference(p: &SsmParams, inp: &ScanInputs<'_>, state: &mut [f32], y: &mut [f32], heads: std::ops::Range<usize>) {
    let (hd, ds, cd) = (p.head_dim(), p.d_state, p.conv_dim());
    let n_t = y.len() / p.d_inner;
    let hpg = p.n_head / p.n_group;
    for t in 0..n_t {
        let row = &inp.xbc[t * cd..(t + 1) * cd];
        for h in heads.clone() {
            let g = h / hpg;
            let b = &row[p.d_inner + g * ds..p.d_inner + (g + 1) * ds];
            let c = &row[p.d_inner + (p.n_group + g) * ds..p.d_inner + (p.n_group + g + 1) * ds];
            let dt = softplus(inp.dt[t * inp.dt_stride + inp.dt_col + h] + inp.dt_bias[h]);
            let da = (dt * inp.a[h]).exp();
            for i in 0..hd {
                let x = row[h * hd + i];
                let xdt = x * dt;
                let s = &mut state[(h * hd + i) * ds..(h * hd + i + 1) * ds];
                let mut sum = 0f32;
                for k in 0..ds {
                    let v = s[k] * da + b[k] * xdt;
                    sum += v * c[k];
                    s[k] = v;
                }
                y[t * p.d_inner + h * hd + i] = sum + x * inp.d[h];
            }
        }
    }
}

/// The same scan in f64 (state and outputs in f64): the oracle of the property tests.
pub fn scan_f64(p: &SsmParams, inp: &ScanInputs<'_>, state: &mut [f64], y: &mut [f64]) {
    let (hd, ds, cd) = (p.head_dim(), p.d_state, p.conv_dim());
    let n_t = y.len() / p.d_inner;
    let hpg = p.n_head / p.n_group;
    for t in 0..n_t {
        let row = &inp.xbc[t * cd..(t + 1) * cd];
        for h in 0..p.n_head {
            let g = h / hpg;
            let raw = inp.dt[t * inp.dt_stride + inp.dt_col + h] as f64 + inp.dt_bias[h] as f64;
            let dt = if raw > 20.0 { raw } else { raw.exp().ln_1p() };
            let da = (dt * inp.a[h] as f64).exp();
            for i in 0..hd {
                let x = row[h * hd + i] as f64;
                let s = &mut state[(h * hd + i) * ds..(h * hd + i + 1) * ds];
                let mut sum = 0f64;
                for k in 0..ds {
                    let bk = row[p.d_inner + g * ds + k] as f64;
                    let ck = row[p.d_inner + (p.n_group + g) * ds + k] as f64;
                    let v = s[k] * da + bk * (x * dt);
                    sum += v * ck;
                    s[k] = v;
                }
                y[t * p.d_inner + h * hd + i] = sum + x * inp.d[h] as f64;
            }
        }
    }
}

/// Reference gated norm: `out = rmsnorm_groups(silu(z) * y) * w`, groups of
/// `d_inner / n_group` values, sum of squares in f64 as ggml does. `z` is read at
/// `z[t * z_stride + i]`.
pub fn gated_norm_reference(p: &SsmParams, y: &[f32], z: &[f32], z_stride: usize, w: &[f32], out: &mut [f32]) {
    let gs = p.d_inner / p.n_group;
    let n_t = y.len() / p.d_inner;
    let mut tmp = vec![0f32; gs];
    for t in 0..n_t {
        for g in 0..p.n_group {
            for i in 0..gs {
                let zi = z[t * z_stride + g * gs + i];
                tmp[i] = zi / (1.0 + (-zi).exp()) * y[t * p.d_inner + g * gs + i];
            }
            let ss: f64 = tmp.iter().map(|&v| (v * v) as f64).sum();
            let scale = 1.0 / ((ss / gs as f64) as f32 + p.eps).sqrt();
            for i in 0..gs {
                out[t * p.d_inner + g * gs + i] = tmp[i] * scale * w[g * gs + i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> SsmParams {
        SsmParams { d_conv: 4, d_inner: 8, d_state: 4, n_group: 2, n_head: 4, eps: 1e-5 }
    }

    /// `n` deterministic values spread around 0: `(i * step % modulo - modulo / 2) / scale`.
    fn values(n: usize, step: usize, modulo: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|i| ((i * step % modulo) as f32 - (modulo / 2) as f32) / scale).collect()
    }

    #[test]
    fn conv_in_pieces_equals_conv_at_once() {
        let p = params();
        let cd = p.conv_dim();
        let n_t = 7;
        let x = values(n_t * cd, 37, 101, 25.0);
        let w = values(cd * p.d_conv, 13, 29, 10.0);
        let mut s1 = vec![0f32; p.conv_state_len()];
        let mut all = vec![0f32; n_t * cd];
        conv_reference(&p, &ConvInputs { xbc: &x, stride: cd, col0: 0, w: &w, bias: None }, &mut s1, &mut all);
        let mut s2 = vec![0f32; p.conv_state_len()];
        let mut pieces = vec![0f32; n_t * cd];
        for (a, b) in [(0, 3), (3, 4), (4, 7)] {
            conv_reference(
                &p,
                &ConvInputs { xbc: &x[a * cd..], stride: cd, col0: 0, w: &w, bias: None },
                &mut s2,
                &mut pieces[a * cd..b * cd],
            );
        }
        assert_eq!(all, pieces);
        assert_eq!(s1, s2);
    }

    #[test]
    fn scan_matches_f64() {
        let p = params();
        let cd = p.conv_dim();
        let n_t = 5;
        let xbc = values(n_t * cd, 7, 23, 7.0);
        let dt: Vec<f32> = (0..n_t * p.n_head).map(|i| (i as f32 - 8.0) / 4.0).collect();
        let a = vec![-0.5, -1.0, -2.0, -0.1];
        let d = vec![1.0, 0.5, 0.0, -1.0];
        let b = vec![0.1, 0.0, -0.2, 0.3];
        let inp = ScanInputs { xbc: &xbc, dt: &dt, dt_stride: p.n_head, dt_col: 0, a: &a, d: &d, dt_bias: &b };
        let mut s = vec![0f32; p.ssm_state_len()];
        let mut y = vec![0f32; n_t * p.d_inner];
        scan_reference(&p, &inp, &mut s, &mut y, 0..p.n_head);
        let mut s64 = vec![0f64; p.ssm_state_len()];
        let mut y64 = vec![0f64; n_t * p.d_inner];
        scan_f64(&p, &inp, &mut s64, &mut y64);
        for (a, b) in y.iter().zip(&y64) {
            assert!((*a as f64 - b).abs() < 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }
}
