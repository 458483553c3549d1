//! Mamba2 layers on the device (`kernels/ssm.cu`): recurrent state per sequence slot, the
//! causal conv1d, the selective scan and the gated grouped RMSNorm, with the semantics of
//! `quarrel_core::ssm`'s references (ggml's operation order).
//!
//! ```text
//!  zxbcdt (n_tok, d_in_proj) ──ssm_conv (carried conv state)──► xbc (n_tok, conv_dim)
//!     (prefill: ssm_conv_par, every token at once, then ssm_conv_state)
//!  xbc + dt (zxbcdt's last n_head columns) ──ssm_scan (carried ssm state)──► y (n_tok, d_inner)
//!     (prefill: ssm_scan_chunk_<64|128|256>, or ssm_scan_chunk for other state sizes: inputs
//!      staged in shared memory per chunk of 32 tokens, decode's bits; `ScanKernel`)
//!  y, z (zxbcdt's first d_inner columns) ──ssm_gated_norm──► out (n_tok, d_inner)
//! ```
//!
//! State: per recurrent layer one f32 allocation of `n_slots` slot-major copies (conv
//! `(conv_dim, d_conv - 1)`, ssm `(n_head, head_dim, d_state)`), zeroed at allocation; a
//! sequence starting at position 0 starts from zeros. Non-finite state values are counted
//! on the device and reported by `state_stats` (the scan itself does not synchronize).

use crate::error::CudaError;
use crate::fusion::Device;
use crate::runtime::{Arg, DevMem};
use quarrel_core::{ForwardBatch, SsmParams, StateSpec};

/// Largest `d_conv` and `d_state` the kernels hold in registers.
const MAX_D_CONV: usize = 8;
const MAX_D_STATE: usize = 256;
/// Tokens per staged chunk of `ssm_scan_chunk` (SCAN_T in ssm.cu).
const SCAN_T: usize = 32;

pub struct CudaState {
    pub spec: StateSpec,
    conv: Vec<Option<DevMem>>,
    ssm: Vec<Option<DevMem>>,
    /// u64 counter of non-finite state values.
    bad: DevMem,
    /// `ssm_conv_scan`'s finished-block counters, one per (state slot, group) (u32; zeroed,
    /// each reset by the group's last block).
    cnt: DevMem,
    /// Groups of the layer with the most (the counters per slot).
    max_groups: usize,
    /// Decode steps' conv and scan as one launch (`ssm_conv_scan`; tests turn it off to
    /// compare against the two launches).
    pub(crate) merge: std::sync::atomic::AtomicBool,
}

impl CudaState {
    pub(crate) fn new(dev: &Device, spec: &StateSpec) -> Result<CudaState, CudaError> {
        let (mut conv, mut ssm) = (Vec::new(), Vec::new());
        for l in &spec.layers {
            let Some(p) = l else {
                conv.push(None);
                ssm.push(None);
                continue;
            };
            p.validate().map_err(CudaError::Shape)?;
            if p.d_conv > MAX_D_CONV || p.d_state > MAX_D_STATE {
                return Err(CudaError::Unsupported(format!(
                    "SSM with d_conv {} / d_state {} (at most {MAX_D_CONV} / {MAX_D_STATE})",
                    p.d_conv, p.d_state
                )));
            }
            for (len, dst) in [(p.conv_state_len(), &mut conv), (p.ssm_state_len(), &mut ssm)] {
                let bytes = len
                    .checked_mul(spec.n_slots)
                    .and_then(|n| n.checked_mul(4))
                    .ok_or_else(|| CudaError::OutOfMemory("recurrent state size overflows".into()))?;
                let m = DevMem::alloc(dev, bytes)?;
                dev.memset0(m.ptr, bytes)?;
                dst.push(Some(m));
            }
        }
        let bad = DevMem::alloc(dev, 8)?;
        dev.memset0(bad.ptr, 8)?;
        let max_groups = spec.layers.iter().flatten().map(|p| p.n_group).max().unwrap_or(1).max(1);
        let cnt_bytes = 4 * max_groups * spec.n_slots.max(1);
        let cnt = DevMem::alloc(dev, cnt_bytes)?;
        dev.memset0(cnt.ptr, cnt_bytes)?;
        Ok(CudaState { spec: spec.clone(), conv, ssm, bad, cnt, max_groups, merge: std::sync::atomic::AtomicBool::new(true) })
    }

    /// (bytes of state, non-finite values met so far).
    pub(crate) fn stats(&self, dev: &Device) -> Result<(u64, u64), CudaError> {
        let bad: Vec<u64> = dev.download(self.bad.ptr, 1)?;
        Ok((self.spec.bytes_per_slot() as u64 * self.spec.n_slots as u64, bad[0]))
    }

    /// Copy every layer's state of slot `src` to slot `dst`.
    pub(crate) fn copy_slot(&self, dev: &Device, src: usize, dst: usize) -> Result<(), CudaError> {
        if src >= self.spec.n_slots || dst >= self.spec.n_slots {
            return Err(CudaError::Shape(format!("state slot {src} -> {dst} of {}", self.spec.n_slots)));
        }
        if src == dst {
            return Ok(());
        }
        for (l, p) in self.spec.layers.iter().enumerate() {
            let Some(p) = p else { continue };
            for (len, m) in [(p.conv_state_len(), &self.conv[l]), (p.ssm_state_len(), &self.ssm[l])] {
                let m = m.as_ref().expect("allocated with the spec");
                let (s, d) = (m.ptr + (4 * src * len) as u64, m.ptr + (4 * dst * len) as u64);
                dev.launch_1d("copy_f32", len as u64, &[Arg::P(s), Arg::P(d), Arg::U64(len as u64)])?;
            }
        }
        Ok(())
    }

    /// The batch's sequences as `[slot, first token, tokens, fresh]` on the device.
    fn seqs(&self, dev: &Device, layer: usize, p: &SsmParams, batch: &ForwardBatch) -> Result<(crate::runtime::PoolMem, usize), CudaError> {
        if self.spec.layers.get(layer).copied().flatten() != Some(*p) {
            return Err(CudaError::Shape(format!("layer {layer} has no recurrent state of shape {p:?}")));
        }
        if batch.state_slots.len() != batch.seqs.len() {
            return Err(CudaError::Shape(format!("{} state slots for {} sequences", batch.state_slots.len(), batch.seqs.len())));
        }
        let mut v = Vec::with_capacity(4 * batch.seqs.len());
        for (s, &slot) in batch.seqs.iter().zip(&batch.state_slots) {
            if slot as usize >= self.spec.n_slots {
                return Err(CudaError::Shape(format!("state slot {slot} of {}", self.spec.n_slots)));
            }
            if s.start + s.len > batch.positions.len() {
                return Err(CudaError::Shape(format!("sequence tokens {}..{} of {}", s.start, s.start + s.len, batch.positions.len())));
            }
            let fresh = s.len > 0 && batch.positions[s.start] == 0;
            v.extend([slot, s.start as u32, s.len as u32, fresh as u32]);
        }
        Ok((dev.upload_async(&v)?, batch.seqs.len()))
    }
}

/// Pointer and length of a device buffer argument.
pub(crate) type Dev = (u64, usize);

fn check(what: &str, got: usize, want: usize) -> Result<(), CudaError> {
    if got != want {
        return Err(CudaError::Shape(format!("{what}: {got} values, expected {want}")));
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn conv(
    dev: &Device,
    st: &CudaState,
    layer: usize,
    p: &SsmParams,
    zx: Dev,
    w: Dev,
    bias: Option<Dev>,
    batch: &ForwardBatch,
    out: Dev,
) -> Result<(), CudaError> {
    let (cd, dp, n) = (p.conv_dim(), p.d_in_proj(), batch.n_tokens());
    check("ssm_conv input", zx.1, n * dp)?;
    check("ssm_conv output", out.1, n * cd)?;
    check("ssm_conv weight", w.1, cd * p.d_conv)?;
    if let Some(b) = bias {
        check("ssm_conv bias", b.1, cd)?;
    }
    let (seq, n_seq) = st.seqs(dev, layer, p, batch)?;
    let state = st.conv[layer].as_ref().expect("checked by seqs").ptr;
    if n > n_seq && n <= i32::MAX as usize {
        // prefill: every token in parallel, then the carried state
        let mut tokseq = vec![u32::MAX; n];
        for (i, sq) in batch.seqs.iter().enumerate() {
            let span = tokseq
                .get_mut(sq.start..sq.start + sq.len)
                .ok_or_else(|| CudaError::Shape(format!("sequence tokens {}..{} of {n}", sq.start, sq.start + sq.len)))?;
            span.iter_mut().for_each(|v| *v = i as u32);
        }
        let ts = dev.upload_async(&tokseq)?;
        dev.launch(
            "ssm_conv_par",
            (n as u32, cd.div_ceil(128) as u32, 1),
            128,
            0,
            &[
                Arg::P(zx.0),
                Arg::P(w.0),
                Arg::P(bias.map_or(0, |b| b.0)),
                Arg::P(seq.ptr()),
                Arg::P(ts.ptr()),
                Arg::P(state),
                Arg::P(out.0),
                Arg::I(cd as i32),
                Arg::I(p.d_conv as i32),
                Arg::I(dp as i32),
                Arg::I(p.d_inner as i32),
            ],
        )?;
        return dev.launch_1d(
            "ssm_conv_state",
            (n_seq * cd) as u64,
            &[
                Arg::P(zx.0),
                Arg::P(seq.ptr()),
                Arg::P(state),
                Arg::I(n_seq as i32),
                Arg::I(cd as i32),
                Arg::I(p.d_conv as i32),
                Arg::I(dp as i32),
                Arg::I(p.d_inner as i32),
            ],
        );
    }
    let c = ConvHeld { layer, p: *p, zx: zx.0, w: w.0, bias: bias.map_or(0, |b| b.0), seq, n_seq, state, out: out.0 };
    // a decode step of one token per sequence: held, the scan that reads `out` joins it
    if st.merge.load(std::sync::atomic::Ordering::Relaxed)
        && batch.seqs.iter().all(|s| s.len <= 1)
        && p.head_dim().is_multiple_of(8)
        && p.n_group <= st.max_groups
        && (n_seq * p.d_inner / 8) <= u32::MAX as usize
    {
        return dev.hold(crate::fusion::Held::SsmConv(c));
    }
    c.launch(dev)
}

/// A decode step's `ssm_conv`, held (`Held::SsmConv`) so that the scan over its output joins
/// it as one `ssm_conv_scan` launch (the same arithmetic: the same bits).
pub(crate) struct ConvHeld {
    layer: usize,
    p: SsmParams,
    zx: u64,
    w: u64,
    bias: u64,
    seq: crate::runtime::PoolMem,
    n_seq: usize,
    state: u64,
    out: u64,
}

impl ConvHeld {
    /// The conv's buffers: the first arguments of `ssm_conv` and of `ssm_conv_scan`.
    fn buffers(&self) -> [Arg; 6] {
        [Arg::P(self.zx), Arg::P(self.w), Arg::P(self.bias), Arg::P(self.seq.ptr()), Arg::P(self.state), Arg::P(self.out)]
    }

    /// Queue it alone (`ssm_conv`).
    pub(crate) fn launch(&self, dev: &Device) -> Result<(), CudaError> {
        let p = &self.p;
        let cd = p.conv_dim();
        let dims = [cd, p.d_conv, p.d_in_proj(), p.d_inner].map(|d| Arg::I(d as i32));
        let args: Vec<Arg> = self.buffers().into_iter().chain([Arg::I(self.n_seq as i32)]).chain(dims).collect();
        dev.launch_1d("ssm_conv", (self.n_seq * cd) as u64, &args)
    }
}

/// Scan inputs: conv output, the projection (for dt), per-head A, D and dt bias.
pub(crate) struct ScanArgs {
    pub xbc: Dev,
    pub zx: Dev,
    pub a: Dev,
    pub d: Dev,
    pub dt_bias: Dev,
}

/// The prefill scan kernel: `ssm_scan_chunk` for any state size, or for state sizes of 64, 128
/// and 256 `ssm_scan_chunk_<ds>` (the size known at compile time, two rows per warp: ~4x fewer
/// instructions, the same bits; tests/ssm.rs compares them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ScanKernel {
    Generic = 0,
    Specialized = 1,
}

impl ScanKernel {
    pub(crate) fn from_u8(v: u8) -> ScanKernel {
        if v == 0 {
            ScanKernel::Generic
        } else {
            ScanKernel::Specialized
        }
    }

    /// The kernel's name and block size for state size `ds`.
    fn pick(self, ds: usize) -> (String, u32) {
        match self {
            ScanKernel::Specialized if matches!(ds, 64 | 128 | 256) => (format!("ssm_scan_chunk_{ds}"), 128),
            _ => ("ssm_scan_chunk".into(), 256),
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn scan(
    dev: &Device,
    st: &CudaState,
    layer: usize,
    p: &SsmParams,
    s: &ScanArgs,
    batch: &ForwardBatch,
    y: Dev,
    kernel: ScanKernel,
) -> Result<(), CudaError> {
    let (cd, dp, n) = (p.conv_dim(), p.d_in_proj(), batch.n_tokens());
    check("ssm_scan input", s.xbc.1, n * cd)?;
    check("ssm_scan projection", s.zx.1, n * dp)?;
    check("ssm_scan output", y.1, n * p.d_inner)?;
    for (what, b) in [("A", s.a), ("D", s.d), ("dt bias", s.dt_bias)] {
        check(&format!("ssm_scan {what}"), b.1, p.n_head)?;
    }
    // the held conv of this layer's step that wrote xbc: one launch for both
    let joins = |h: &crate::fusion::Held| matches!(h, crate::fusion::Held::SsmConv(c) if c.out == s.xbc.0 && c.layer == layer && c.p == *p && c.zx == s.zx.0);
    if let Some(crate::fusion::Held::SsmConv(c)) = dev.take_held_if(joins) {
        let state = st.ssm[layer].as_ref().ok_or_else(|| CudaError::Shape(format!("layer {layer} has no recurrent state")))?.ptr;
        return dev.launch(
            "ssm_conv_scan",
            ((c.n_seq * p.d_inner / 8) as u32, 1, 1),
            256,
            (4 * (2 * p.d_state + 8)) as u32,
            &c.buffers()
                .into_iter()
                .chain([s.a.0, s.d.0, s.dt_bias.0, state, y.0, st.bad.ptr].map(Arg::P))
                .chain([Arg::I(c.n_seq as i32)])
                .chain(scan_dims(p))
                .chain([Arg::I(p.d_conv as i32), Arg::P(st.cnt.ptr)])
                .collect::<Vec<_>>(),
        );
    }
    let (seq, n_seq) = st.seqs(dev, layer, p, batch)?;
    let state = st.ssm[layer].as_ref().expect("checked by seqs").ptr;
    // both scans' leading pointers (the one-token scan adds the sequence count after them)
    let io = [s.xbc.0, s.zx.0, s.a.0, s.d.0, s.dt_bias.0, seq.ptr(), state, y.0, st.bad.ptr].map(Arg::P);
    if n > n_seq && p.head_dim().is_multiple_of(8) && p.d_state.is_multiple_of(4) && n_seq * p.d_inner / 8 <= i32::MAX as usize {
        // prefill: inputs staged per chunk of tokens, 8 rows of a head per block
        let (name, threads) = kernel.pick(p.d_state);
        return dev.launch(
            &name,
            ((n_seq * p.d_inner / 8) as u32, 1, 1),
            threads,
            (4 * SCAN_T * (2 * p.d_state + 10)) as u32,
            &[io.as_slice(), &scan_dims(p)].concat(),
        );
    }
    let warps = (n_seq * p.d_inner) as u64;
    let blocks = warps.div_ceil(8);
    if blocks > u32::MAX as u64 {
        return Err(CudaError::Shape(format!("ssm_scan: {warps} rows is too many for one launch")));
    }
    dev.launch("ssm_scan", (blocks as u32, 1, 1), 256, 0, &[io.as_slice(), &[Arg::I(n_seq as i32)], &scan_dims(p)].concat())
}

/// The head shape every scan kernel takes after its pointers (and sequence count): heads, head
/// dim, state size, groups, the in-projection's row and its dt column.
fn scan_dims(p: &SsmParams) -> [Arg; 6] {
    let dp = p.d_in_proj();
    [p.n_head, p.head_dim(), p.d_state, p.n_group, dp, dp - p.n_head].map(|v| Arg::I(v as i32))
}

/// `q8`: where the output's Q8 form goes too (`(0, 0)`: not written; else the group size must
/// be a multiple of 32, see `gated_norm_q8`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gated_norm(dev: &Device, p: &SsmParams, y: Dev, zx: Dev, w: Dev, out: Dev, q8: (u64, u64)) -> Result<(), CudaError> {
    if !y.1.is_multiple_of(p.d_inner) {
        return Err(CudaError::Shape(format!("ssm_gated_norm: {} values are not rows of {}", y.1, p.d_inner)));
    }
    let n = y.1 / p.d_inner;
    check("ssm_gated_norm projection", zx.1, n * p.d_in_proj())?;
    check("ssm_gated_norm weight", w.1, p.d_inner)?;
    check("ssm_gated_norm output", out.1, y.1)?;
    if n == 0 {
        return Ok(());
    }
    let gs = p.d_inner / p.n_group;
    // one block per (token, group): up to 1024 threads (a decode step has one token: a single
    // block over the whole group, Granite-4's 3,072 values); from the group size only, so
    // prefill and decode sum alike
    let threads = (gs.div_ceil(32) * 32).clamp(32, 1024) as u32;
    dev.launch(
        "ssm_gated_norm",
        (n as u32, p.n_group as u32, 1),
        threads,
        0,
        &[
            Arg::P(y.0),
            Arg::P(zx.0),
            Arg::P(w.0),
            Arg::P(out.0),
            Arg::I(p.d_inner as i32),
            Arg::I(p.n_group as i32),
            Arg::I(p.d_in_proj() as i32),
            Arg::F(p.eps),
            Arg::P(q8.0),
            Arg::P(q8.1),
        ],
    )
}

/// Whether `ssm_gated_norm` can write its output's Q8 form (each warp one Q8 block).
pub(crate) fn gated_norm_q8(p: &SsmParams) -> bool {
    p.n_group > 0 && p.d_inner.is_multiple_of(p.n_group) && (p.d_inner / p.n_group).is_multiple_of(32)
}
