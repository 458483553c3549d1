//! # quarrel-cuda: the CUDA backend
//!
//! ```text
//!  GGUF tensor ──repack (16-byte planes)──► device weight (uploaded once)
//!  model ops ──► kernels (.cu in kernels/, embedded, NVRTC-compiled for the device's arch on
//!                first use, PTX cached on disk by source hash + arch) ──► launch queue
//!                (held ops fused: (scaled) add+rms_norm, grouped GEMVs, paired RoPE) ──► one CUDA stream
//!                (a repeating step replayed as one CUDA graph; PDL on sm_90+)
//!  activations: pooled device buffers; only `download` / `argmax_rows` synchronizes
//! ```
//!
//! The driver API, NVRTC and cuBLAS are loaded at run time (cudarc), so this crate builds and
//! links on machines without CUDA; `device_count()` says whether a GPU can be used.
//!
//! | module      | responsibility |
//! |-------------|----------------|
//! | `runtime`   | context, stream, memory pool, NVRTC compile + disk cache, launch queue, CUDA graphs, PDL (names no op) |
//! | `kernels`   | kernel sources and units; the registry (`KERNELS`, derived from the sources by build.rs): every kernel and whether it waits for its predecessor |
//! | `fusion`    | the launch an op holds back and how the next op absorbs it (`Held`) |
//! | `weights`   | `CudaWeight`: per-type repacking and upload; `unit` (decoding twin); `experts` (expert budget / cache) |
//! | `matmul`    | GEMV (dp4a over Q8 / f32 for float weights), cuBLAS GEMM; `mmq` (quantized GEMM on tensor cores), `mmq_order` (every matmul in MMQ's float order), `cpu_order` (Q4_0 / Q4_1 / Q8_0 in the CPU's float order) |
//! | `attention` | paged attention: split-K, one-pass vector (CPU numerics), tensor-core prefill, batched decode |
//! | `moe`       | MoE: `device_route` (routing + decode expert GEMVs + combine on the device), `grouped_gemm` (one MMQ launch over every expert), `chunked_gemv`, `host_route` |
//! | `ssm`       | Mamba2: recurrent state slots, conv1d, selective scan, gated norm |
//! | `norm`      | RMSNorm launches (plain, after an add, after a combine) |
//! | `sample`    | argmax and sampling rows on the device |
//! | `batch`     | a batch's positions, KV slots, attention tiles and block tables on the device |
//! | `kv`        | `CudaKv`: paged K/V per layer (f32, f16, q8_0, q4_0) |
//! | `bufs`      | buffer access and the Q8 activation cache |
//! | `ops`       | the longest `Backend` op bodies (RoPE and its fusions, GELU, ReLU², MoE routing) |
//! | `config`    | `set_numerics`, the expert budget, the `test-switches` setters |
//! | `probe`     | entry points that run one path directly (tests, benchmarks) and device probes |
//! | `tuning`    | the environment variables the crate reads, parsed once (`tuning_table`) |
//! | `error`     | `CudaError` -> `CoreError` |
//!
//! Kernels (kernels/): `common.cuh` (quant unit decoding, `GDC()`), `matmul.cu`, `ops.cu` (norm,
//! rope, swiglu, kv store), `attention.cu` (flash-style paged attention with split-K), `mmq.cu`
//! (quantized GEMM on the int8 tensor cores), `gemvm.cu` (the decode GEMV in MMQ's order),
//! `exact.cu` (GEMVs in the CPU's order), `moe.cu`, `ssm.cu` (Mamba2).

mod attention;
mod batch;
mod bufs;
mod config;
mod error;
mod fusion;
mod kernels;
mod kv;
mod matmul;
mod moe;
mod norm;
mod ops;
mod probe;
mod runtime;
mod sample;
mod ssm;
mod tuning;
mod weights;

pub use attention::{invariant_one_pass_below, MMA_MIN_TOKENS, VEC_MAX_POSITIONS};
pub use error::CudaError;
pub use kernels::KERNELS;
pub use kv::CudaKv;
pub use matmul::mmq;
pub use runtime::{available, device_count};
pub use ssm::ScanKernel;
pub use tuning::tuning_table;
pub use weights::experts::ExpertStats;
pub use weights::{repack, CudaWeight, DevType};

use batch::DevBatch;
use cudarc::cublas::CudaBlas;
use fusion::{Device, Held};
use quarrel_core::{
    AttnParams, Backend, CoreError, ForwardBatch, KvSpec, MoeRouting, Numerics, QuantType, Result, RopeParams, Route, SsmParams, StateSpec,
    WeightSource,
};
use runtime::{Arg, PoolMem};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// f32 activations in a pooled device buffer.
///
/// `alloc` promises zeros; the memset is deferred until something reads the buffer before
/// an op has overwritten all of it (most buffers are outputs, so most memsets never run).
pub struct CudaBuf {
    mem: PoolMem,
    len: usize,
    zero_pending: AtomicBool,
}

impl CudaBuf {
    pub fn ptr(&self) -> u64 {
        self.mem.ptr()
    }
}

pub struct CudaBackend {
    dev: Device,
    blas: CudaBlas,
    ordinal: usize,
    /// The index arrays of the step's last two distinct batches (reused by every layer of a
    /// forward; an encoder alternates two per layer: its tokens stored at their own positions,
    /// and attending from the last one), oldest first.
    batch: Mutex<Vec<DevBatch>>,
    /// RoPE frequency factors on the device, by content.
    freq_factors: Mutex<Vec<(Vec<f32>, PoolMem)>>,
    /// llama.cpp's f16 GELU table (`quarrel_core::act`), uploaded at the first `geglu`.
    gelu_table: Mutex<Option<PoolMem>>,
    /// The last activations quantized to Q8 (q, k and v share their input; so do gate and up).
    qcache: Mutex<Option<matmul::QCache>>,
    /// The Q8 activations cached before `qcache` where two ops wrote theirs in one launch (`relu_sqr2`:
    /// the routed experts' and the shared expert's); a matmul over them swaps it back in (`promote_q8`).
    qprev: Mutex<Option<matmul::QCache>>,
    /// Expert selections per layer and expert (`moe_selections`).
    moe_counts: Mutex<Vec<Vec<u64>>>,
    /// Device bytes for expert tensors (`set_expert_budget`) and the expert cache's counters.
    experts: crate::weights::experts::ExpertBudget,
    /// Routing on the device for decode steps (`moe_dev`).
    router: crate::moe::device_route::DevRouter,
    /// `quarrel_core::Numerics` as u8 (`set_numerics`).
    numerics: std::sync::atomic::AtomicU8,
    /// Contexts (positions) up to which f16-cache attention of short sequences takes the
    /// one-pass kernel with the CPU's numerics (`attention::VEC_MAX_POSITIONS`; tests:
    /// `set_attn_vec_max`).
    attn_vec_max: std::sync::atomic::AtomicUsize,
    /// Prefill batches of at least this many tokens take the tensor-core attention over f16
    /// caches (`attention::MMA_MIN_TOKENS`; tests: `set_attn_mma_min`, usize::MAX: never).
    attn_mma_min: std::sync::atomic::AtomicUsize,
    /// Q4_0 / Q4_1 / Q8_0 matmuls of up to `cpu_order::ORDERED_MAX_TOKENS` tokens in the CPU's
    /// float order: `cpu_order::OrderedGemv` as u8 (default auto: small models; tests:
    /// `set_ordered_gemv`).
    ordered_gemv: std::sync::atomic::AtomicU8,
    /// Bytes of all weights loaded on this backend (the auto choice of `ordered_gemv`).
    loaded_bytes: std::sync::atomic::AtomicUsize,
    /// Decode batches of several sequences take the grouped-query kernel where it applies
    /// (tests compare it with the per-head kernel: `set_gqa_decode`).
    gqa_decode: AtomicBool,
    /// The prefill scan kernel (`ssm::ScanKernel` as u8; tests: `set_scan_kernel`).
    scan_kernel: std::sync::atomic::AtomicU8,
}

impl CudaBackend {
    /// The backend on GPU `ordinal`: kernels are compiled (or read from the cache) here.
    pub fn new(ordinal: usize) -> std::result::Result<CudaBackend, CudaError> {
        let dev = Device::new(ordinal, &kernels::PROGRAM, &kernels::all())?;
        // SAFETY: only probes for the shared library.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(CudaError::NoDevice("cuBLAS (libcublas.so) not found: add the CUDA libraries to LD_LIBRARY_PATH".into()));
        }
        let blas = CudaBlas::new(dev.stream.clone()).map_err(|e| CudaError::Blas(format!("creating a handle: {e:?}")))?;
        Ok(CudaBackend {
            dev,
            blas,
            ordinal,
            batch: Mutex::new(Vec::new()),
            freq_factors: Mutex::new(Vec::new()),
            gelu_table: Mutex::new(None),
            qcache: Mutex::new(None),
            qprev: Mutex::new(None),
            moe_counts: Mutex::new(Vec::new()),
            experts: crate::weights::experts::ExpertBudget::new(None),
            router: Default::default(),
            numerics: (Numerics::Fast as u8).into(),
            attn_vec_max: attention::VEC_MAX_POSITIONS.into(),
            attn_mma_min: attention::MMA_MIN_TOKENS.into(),
            ordered_gemv: (crate::matmul::cpu_order::OrderedGemv::Auto as u8).into(),
            loaded_bytes: 0.into(),
            gqa_decode: true.into(),
            scan_kernel: (ssm::ScanKernel::Specialized as u8).into(),
        })
    }

    /// `x += y` (`x += s·y`) to hold: joined to the held MoE combine that writes `y`, if any.
    fn held_add(&self, x: u64, y: u64, n: u64, s: Option<f32>) -> Held {
        match self.dev.take_held_if(|h| matches!(h, Held::Comb(c) if c.out == y && (c.n_tok * c.d) as u64 == n)) {
            Some(Held::Comb(c)) => Held::CombAdd { c, x, n, s },
            _ => Held::Add { x, y, n, s },
        }
    }

    /// A download of ids ended the step (as `download`): drop the step's cached arrays so that
    /// the next step allocates from the same pool state (same pointers: its graph replays).
    fn step_end(&self) -> Result<()> {
        if let Ok(mut g) = self.batch.lock() {
            g.clear();
        }
        for q in [&self.qcache, &self.qprev] {
            if let Ok(mut g) = q.lock() {
                *g = None;
            }
        }
        Ok(self.dev.flush()?)
    }

    fn buf(&self, n: usize) -> Result<CudaBuf> {
        Ok(CudaBuf { mem: self.dev.scratch(4 * n.max(1))?, len: n, zero_pending: AtomicBool::new(false) })
    }

    fn with_batch<T>(&self, b: &ForwardBatch, kv: &CudaKv, window: Option<usize>, f: impl FnOnce(&DevBatch) -> Result<T>) -> Result<T> {
        /// Distinct batches kept per step.
        const KEPT: usize = 2;
        let mut g = self.batch.lock().map_err(|_| CoreError::Backend("batch lock poisoned".into()))?;
        // kv_store (no window) can use arrays built for a windowed attention: slots agree
        let fits = |d: &DevBatch| {
            d.matches(b, kv.spec.block_size, window)
                || (window.is_none() && d.matches_positions(&b.positions) && d.matches(b, kv.spec.block_size, d.window()))
        };
        let i = match g.iter().position(fits) {
            Some(i) => i,
            None => {
                if g.len() == KEPT {
                    g.remove(0);
                }
                g.push(DevBatch::new(&self.dev, b, kv.spec.block_size, kv.spec.n_blocks, window)?);
                g.len() - 1
            }
        };
        f(&g[i])
    }

    fn positions_ptr(&self, positions: &[u32]) -> Result<(u64, Option<PoolMem>)> {
        if let Ok(g) = self.batch.lock() {
            if let Some(d) = g.iter().find(|d| d.n_tok == positions.len() && d.matches_positions(positions)) {
                return Ok((d.pos(), None));
            }
        }
        let m = self.dev.upload_async(positions)?;
        Ok((m.ptr(), Some(m)))
    }

    fn freq_factors_ptr(&self, ff: &Option<Vec<f32>>) -> Result<u64> {
        let Some(ff) = ff else { return Ok(0) };
        let mut g = self.freq_factors.lock().map_err(|_| CoreError::Backend("lock poisoned".into()))?;
        if let Some((_, m)) = g.iter().find(|(v, _)| v == ff) {
            return Ok(m.ptr());
        }
        let m = self.dev.upload_async(ff)?;
        let p = m.ptr();
        g.push((ff.clone(), m));
        Ok(p)
    }
}

fn state(kv: &CudaKv) -> Result<&ssm::CudaState> {
    kv.state.as_ref().ok_or_else(|| CoreError::Shape("the cache has no recurrent state (alloc_state not called)".into()))
}

fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(CoreError::Shape(format!("{what}: buffer has {got} elements, expected {want}")));
    }
    Ok(())
}

/// The checks of a row norm of `x` into `out` by the f32 vectors `vecs` (weight, bias): the
/// row width (the vectors' length) and the row count; None where `x` has no rows.
fn norm_rows(what: &str, x: &CudaBuf, out: &CudaBuf, vecs: &[&CudaWeight]) -> Result<Option<(usize, u32)>> {
    check_len(&format!("{what} output"), out.len, x.len)?;
    let d = vecs[0].n_in;
    for v in vecs {
        if v.n_out != 1 || v.dev_ty != DevType::F32 || v.n_in != d {
            return Err(CoreError::Shape(format!("weight of shape ({}, {}) used as a vector of {d}", v.n_in, v.n_out)));
        }
    }
    if d == 0 || !x.len.is_multiple_of(d) {
        return Err(CoreError::Shape(format!("{what}: {} values are not rows of {d}", x.len)));
    }
    let rows = (x.len / d) as u32;
    Ok((rows > 0).then_some((d, rows)))
}

impl Backend for CudaBackend {
    type Buf = CudaBuf;
    type Weight = CudaWeight;
    type Kv = CudaKv;

    fn name(&self) -> String {
        format!("cuda:{} ({}, sm_{}{})", self.ordinal, self.dev.name, self.dev.cc.0, self.dev.cc.1)
    }

    fn computes_on_host(&self) -> bool {
        false
    }

    fn load_weight(&self, src: WeightSource<'_>) -> Result<CudaWeight> {
        self.dev.bind()?;
        let w = CudaWeight::load(&self.dev, src, &self.experts).map_err(|e| match e {
            CudaError::OutOfMemory(m) => CoreError::OutOfMemory(format!(
                "out of GPU memory loading {}: {m}{}",
                src.name,
                if src.name.contains("_exps") {
                    ""
                } else {
                    " (--expert-budget keeps experts in host memory; this is a dense weight, so the model needs a larger GPU or the CPU)"
                }
            )),
            e => e.into(),
        })?;
        self.loaded_bytes.fetch_add(w.bytes, Ordering::Relaxed);
        Ok(w)
    }

    fn weight_dims(&self, w: &CudaWeight) -> (usize, usize) {
        (w.n_in, w.n_out)
    }

    fn weight_type(&self, w: &CudaWeight) -> QuantType {
        w.ty
    }

    fn alloc(&self, n: usize) -> Result<CudaBuf> {
        self.dev.bind()?;
        let b = self.buf(n)?;
        b.zero_pending.store(true, Ordering::Release);
        Ok(b)
    }

    fn upload(&self, src: &[f32]) -> Result<CudaBuf> {
        self.dev.bind()?;
        let mem = self.dev.upload_async(src)?;
        self.written(mem.ptr());
        Ok(CudaBuf { mem, len: src.len(), zero_pending: AtomicBool::new(false) })
    }

    fn download(&self, src: &CudaBuf) -> Result<Vec<f32>> {
        self.dev.bind()?;
        if src.zero_pending.load(Ordering::Acquire) {
            return Ok(vec![0.0; src.len]);
        }
        let v = self.dev.download(src.ptr(), src.len)?;
        // a download ends a step: drop the step's cached arrays so that the next step
        // allocates from the same pool state (same pointers: its graph can be replayed)
        if let Ok(mut g) = self.batch.lock() {
            g.clear();
        }
        for q in [&self.qcache, &self.qprev] {
            if let Ok(mut g) = q.lock() {
                *g = None;
            }
        }
        self.dev.flush()?;
        Ok(v)
    }

    fn argmax_rows(&self, x: &CudaBuf, dim: usize) -> Result<Vec<u32>> {
        self.dev.bind()?;
        if dim == 0 || !x.len.is_multiple_of(dim) {
            return Err(CoreError::Shape(format!("argmax_rows: {} values are not rows of {dim}", x.len)));
        }
        let rows = x.len / dim;
        if rows == 0 {
            return Ok(vec![]);
        }
        let xp = self.rd(x)?;
        let ids = self.dev.scratch(4 * rows)?;
        self.dev.launch("argmax_rows", (rows as u32, 1, 1), 1024, 0, &[Arg::P(xp), Arg::P(ids.ptr()), Arg::I(dim as i32)])?;
        let v = self.dev.download::<u32>(ids.ptr(), rows)?;
        self.step_end()?;
        Ok(v)
    }

    fn sample_rows(&self, x: &CudaBuf, dim: usize, rows: &[quarrel_core::SampleRow], masks: quarrel_core::RowMasks) -> Result<Vec<u32>> {
        sample::sample_rows(self, x, dim, rows, masks)
    }

    fn buf_len(&self, b: &CudaBuf) -> usize {
        b.len
    }

    fn alloc_kv(&self, spec: &KvSpec) -> Result<CudaKv> {
        self.dev.bind()?;
        Ok(CudaKv::new(&self.dev, spec)?)
    }

    fn embed(&self, table: &CudaWeight, tokens: &[u32], out: &mut CudaBuf) -> Result<()> {
        self.dev.bind()?;
        let d = table.n_in;
        check_len("embed output", out.len, tokens.len() * d)?;
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= table.n_out) {
            return Err(CoreError::Model(format!("token id {t} is outside the vocabulary of {}", table.n_out)));
        }
        self.dev.step_begins(tokens.len() > matmul::GEMV_MAX_TOKENS);
        let tok = self.dev.upload_async(tokens)?;
        let n = tokens.len() as i32;
        let o = self.wr(out);
        match table.dev_ty {
            DevType::Quant(name) => {
                let units = (tokens.len() * d / 32) as u64;
                self.dev.launch_1d(
                    &format!("embed_{name}"),
                    units,
                    &[Arg::P(table.p.ptr), Arg::P(table.m_ptr()), Arg::P(tok.ptr()), Arg::P(o), Arg::I((d / 32) as i32), Arg::I(n)],
                )?
            }
            t => self.dev.launch_1d(
                &format!("embed_{}", t.name()),
                (tokens.len() * d) as u64,
                &[Arg::P(table.p.ptr), Arg::P(tok.ptr()), Arg::P(o), Arg::I(d as i32), Arg::I(n)],
            )?,
        }
        Ok(())
    }

    fn matmul(&self, w: &CudaWeight, x: &CudaBuf, n_tok: usize, out: &mut CudaBuf) -> Result<()> {
        self.dev.bind()?;
        check_len("matmul input", x.len, n_tok * w.n_in)?;
        check_len("matmul output", out.len, n_tok * w.n_out)?;
        if w.offload.is_some() {
            return Err(CoreError::Unsupported("a plain matmul over an expert tensor kept in host memory (moe_matmul only)".into()));
        }
        let xp = self.rd(x)?;
        self.promote_q8(xp);
        let op = self.wr(out);
        if self.exact_mm() {
            return Ok(crate::matmul::cpu_order::matmul(&self.dev, &self.qcache, w, xp, n_tok, op)?);
        }
        if self.invariant_mm() {
            return Ok(crate::matmul::mmq_order::matmul(&self.dev, &self.qcache, w, xp, n_tok, op)?);
        }
        Ok(matmul::matmul(&self.dev, &self.blas, &self.qcache, w, xp, n_tok, op, self.ordered_gemv())?)
    }

    fn rms_norm(&self, x: &CudaBuf, w: &CudaWeight, eps: f32, out: &mut CudaBuf) -> Result<()> {
        self.dev.bind()?;
        let Some((d, rows)) = norm_rows("rms_norm", x, out, &[w])? else {
            return Ok(());
        };
        let (xp, op) = (self.rd(x)?, self.wr(out));
        let (xq, xm) = if d.is_multiple_of(32) { self.q8_out(op, x.len)? } else { (0, 0) };
        Ok(norm::rms_norm(&self.dev, norm::Row { x: xp, w: w.p.ptr, out: op, d, rows, eps, xq, xm })?)
    }

    fn layer_norm(&self, x: &CudaBuf, w: &CudaWeight, b: &CudaWeight, eps: f32, out: &mut CudaBuf) -> Result<()> {
        self.dev.bind()?;
        let Some((d, rows)) = norm_rows("layer_norm", x, out, &[w, b])? else {
            return Ok(());
        };
        let (xp, op) = (self.rd(x)?, self.wr(out));
        let args = [Arg::P(xp), Arg::P(w.p.ptr), Arg::P(b.p.ptr), Arg::P(op), Arg::I(d as i32), Arg::F(eps)];
        self.dev.launch("layer_norm", (rows, 1, 1), 256, 0, &args)?;
        Ok(())
    }

    fn rope(&self, x: &mut CudaBuf, positions: &[u32], n_head: usize, head_dim: usize, p: &RopeParams) -> Result<()> {
        self.rope_op(x, positions, n_head, head_dim, p)
    }

    fn swiglu(&self, gate: &CudaBuf, up: &CudaBuf, out: &mut CudaBuf) -> Result<()> {
        self.glu_op("swiglu", gate, up, out, &[])
    }

    fn swiglu_oai(&self, gate: &CudaBuf, up: &CudaBuf, out: &mut CudaBuf, alpha: f32, limit: f32) -> Result<()> {
        self.glu_op("swiglu_oai", gate, up, out, &[Arg::F(alpha), Arg::F(limit)])
    }

    fn geglu(&self, gate: &CudaBuf, up: &CudaBuf, out: &mut CudaBuf) -> Result<()> {
        self.geglu_op(gate, up, out)
    }

    fn gelu(&self, x: &mut CudaBuf) -> Result<()> {
        self.gelu_op(x)
    }

    fn add(&self, x: &mut CudaBuf, y: &CudaBuf) -> Result<()> {
        self.dev.bind()?;
        check_len("add", y.len, x.len)?;
        let n = x.len as u64;
        let (xp, yp) = (self.rw(x)?, self.rd(y)?);
        if n > 0 {
            // held: an RMSNorm of x that follows absorbs it (`add_rms_norm`; with the MoE
            // combine that wrote y held too, `comb_add_rms_norm`)
            return Ok(self.dev.hold(self.held_add(xp, yp, n, None))?);
        }
        self.dev.launch_1d("add", n, &[Arg::P(xp), Arg::P(yp), Arg::U64(n)])?;
        Ok(())
    }

    /// One launch for scale-then-add (`y` is left as it was): `x += s·y`, the product rounded
    /// first; held like `add`, so a following RMSNorm of `x` absorbs it (`add_scaled_rms_norm`).
    fn add_scaled(&self, x: &mut CudaBuf, y: &mut CudaBuf, s: f32) -> Result<()> {
        if s == 1.0 {
            return self.add(x, y);
        }
        self.dev.bind()?;
        check_len("add_scaled", y.len, x.len)?;
        let n = x.len as u64;
        let (xp, yp) = (self.rw(x)?, self.rd(y)?);
        if n > 0 {
            return Ok(self.dev.hold(self.held_add(xp, yp, n, Some(s)))?);
        }
        self.dev.launch_1d("add_scaled", n, &[Arg::P(xp), Arg::P(yp), Arg::F(s), Arg::U64(n)])?;
        Ok(())
    }

    fn add_bias(&self, x: &mut CudaBuf, b: &CudaBuf) -> Result<()> {
        self.dev.bind()?;
        let d = b.len;
        if d == 0 || !x.len.is_multiple_of(d) {
            return Err(CoreError::Shape(format!("add_bias: {} values are not rows of {d}", x.len)));
        }
        let n = x.len as u64;
        let (xp, bp) = (self.rw(x)?, self.rd(b)?);
        self.dev.launch_1d("add_bias", n, &[Arg::P(xp), Arg::P(bp), Arg::U64(d as u64), Arg::U64(n)])?;
        Ok(())
    }

    fn scale(&self, x: &mut CudaBuf, s: f32) -> Result<()> {
        self.dev.bind()?;
        let n = x.len as u64;
        let xp = self.rw(x)?;
        self.dev.launch_1d("scale", n, &[Arg::P(xp), Arg::F(s), Arg::U64(n)])?;
        Ok(())
    }

    fn gather_rows(&self, x: &CudaBuf, dim: usize, rows: &[usize], out: &mut CudaBuf) -> Result<()> {
        self.gather_rows_op(x, dim, rows, out)
    }

    fn kv_store(&self, kv: &mut CudaKv, layer: usize, k: &CudaBuf, v: &CudaBuf, batch: &ForwardBatch) -> Result<()> {
        self.kv_store_dev(kv, layer, k, v, batch)
    }

    fn attention(
        &self,
        q: &CudaBuf,
        kv: &CudaKv,
        l: usize,
        b: &ForwardBatch,
        p: &AttnParams,
        s: Option<&CudaBuf>,
        o: &mut CudaBuf,
    ) -> Result<()> {
        self.attention_dev(q, kv, l, b, p, s, o)
    }

    // ---- MoE (moe.rs) and Mamba2 (ssm.rs) ---------------------------------------------------

    fn moe_router(
        &self,
        layer: usize,
        w: &CudaWeight,
        x: &CudaBuf,
        n_tok: usize,
        bias: Option<&CudaBuf>,
        p: &MoeRouting,
    ) -> Result<Vec<Route>> {
        self.dev.bind()?;
        // decode steps routed on the device: the router matmul and the routing in one launch
        // (in exact numerics too: its logits are gemv_f32's, its routes moe_route's, bit for
        // bit, the arithmetic a prefill's router takes below)
        if !self.experts.any_offloaded() && x.len == n_tok * w.n_in && bias.is_none_or(|b| b.len == p.n_expert) {
            let xp = self.rd(x)?;
            let bp = match bias {
                Some(b) => self.rd(b)?,
                None => 0,
            };
            if let Some(r) = self.router.route_fused(&self.dev, &self.qcache, Some(layer), w, xp, n_tok, bp, p)? {
                return Ok(r);
            }
        }
        let mut logits = self.alloc(n_tok * p.n_expert)?; // (n_tok, n_expert)
        self.matmul(w, x, n_tok, &mut logits)?;
        self.moe_route(layer, &logits, bias, p)
    }

    fn moe_route(&self, layer: usize, logits: &CudaBuf, bias: Option<&CudaBuf>, p: &MoeRouting) -> Result<Vec<Route>> {
        self.moe_route_op(layer, logits, bias, p)
    }

    fn moe_selections(&self) -> Result<Vec<Vec<u64>>> {
        let mut c = self.moe_counts.lock().map_err(|_| CoreError::Backend("lock poisoned".into()))?.clone();
        self.router.add_counts(&self.dev, &mut c)?;
        Ok(c)
    }

    fn moe_matmul(
        &self,
        w: &CudaWeight,
        n_expert: usize,
        x: &CudaBuf,
        routes: &[Route],
        x_per_token: bool,
        out: &mut CudaBuf,
    ) -> Result<()> {
        self.dev.bind()?;
        check_len("moe_matmul output", out.len, routes.len() * (w.n_out / n_expert.max(1)))?;
        let (xp, op) = (self.rd(x)?, self.wr(out));
        self.promote_q8(xp);
        if crate::moe::device_route::on_device(routes) {
            let order = if self.exact_mm() {
                crate::moe::device_route::Order::Exact
            } else if self.invariant_mm() {
                crate::moe::device_route::Order::Invariant
            } else {
                crate::moe::device_route::Order::Fast
            };
            return Ok(self.router.matmul(&self.dev, &self.qcache, w, n_expert, xp, x.len, routes.len(), x_per_token, op, order)?);
        }
        Ok(moe::moe_matmul(&self.dev, &self.qcache, &self.experts, w, n_expert, xp, x.len, routes, x_per_token, op, self.exact_mm())?)
    }

    fn moe_add_bias(&self, y: &mut CudaBuf, bias: &CudaBuf, routes: &[Route]) -> Result<()> {
        self.moe_add_bias_op(y, bias, routes)
    }

    fn moe_combine(&self, y: &CudaBuf, routes: &[Route], out: &mut CudaBuf) -> Result<()> {
        self.dev.bind()?;
        let yp = self.rd(y)?;
        // an output still pending its zero fill is written by the combine (no fill launch)
        let fresh = out.zero_pending.load(Ordering::Acquire) && !routes.is_empty();
        let op = if fresh { self.wr(out) } else { self.rw(out)? };
        if crate::moe::device_route::on_device(routes) {
            return Ok(self.router.combine(&self.dev, yp, y.len, routes.len(), op, out.len, fresh)?);
        }
        Ok(moe::moe_combine(&self.dev, yp, y.len, routes, op, out.len, fresh)?)
    }

    fn relu_sqr(&self, x: &mut CudaBuf) -> Result<()> {
        self.relu_sqr_op(x)
    }

    fn alloc_state(&self, kv: &mut CudaKv, spec: &StateSpec) -> Result<()> {
        self.dev.bind()?;
        kv.state = Some(ssm::CudaState::new(&self.dev, spec)?);
        Ok(())
    }

    fn state_stats(&self, kv: &CudaKv) -> Result<(u64, u64)> {
        self.dev.bind()?;
        Ok(state(kv)?.stats(&self.dev)?)
    }

    fn state_copy(&self, kv: &mut CudaKv, src: usize, dst: usize) -> Result<()> {
        self.dev.bind()?;
        Ok(state(kv)?.copy_slot(&self.dev, src, dst)?)
    }

    fn ssm_conv(
        &self,
        kv: &mut CudaKv,
        layer: usize,
        p: &SsmParams,
        zx: &CudaBuf,
        w: &CudaBuf,
        bias: Option<&CudaBuf>,
        batch: &ForwardBatch,
        out: &mut CudaBuf,
    ) -> Result<()> {
        self.dev.bind()?;
        let (zp, wp) = ((self.rd(zx)?, zx.len), (self.rd(w)?, w.len));
        let bp = bias.map(|b| Ok::<_, CoreError>((self.rd(b)?, b.len))).transpose()?;
        let op = (self.wr(out), out.len);
        Ok(ssm::conv(&self.dev, state(kv)?, layer, p, zp, wp, bp, batch, op)?)
    }

    fn ssm_scan(
        &self,
        kv: &mut CudaKv,
        layer: usize,
        p: &SsmParams,
        xbc: &CudaBuf,
        zx: &CudaBuf,
        a: &CudaBuf,
        d: &CudaBuf,
        dt_bias: &CudaBuf,
        batch: &ForwardBatch,
        y: &mut CudaBuf,
    ) -> Result<u64> {
        self.dev.bind()?;
        let r = |b: &CudaBuf| Ok::<_, CoreError>((self.rd(b)?, b.len));
        let args = ssm::ScanArgs { xbc: r(xbc)?, zx: r(zx)?, a: r(a)?, d: r(d)?, dt_bias: r(dt_bias)? };
        let yp = (self.wr(y), y.len);
        let kernel = ssm::ScanKernel::from_u8(self.scan_kernel.load(Ordering::Relaxed));
        ssm::scan(&self.dev, state(kv)?, layer, p, &args, batch, yp, kernel)?;
        // non-finite state values are counted on the device (state_stats), not per call
        Ok(0)
    }

    fn ssm_gated_norm(&self, p: &SsmParams, y: &CudaBuf, zx: &CudaBuf, w: &CudaBuf, out: &mut CudaBuf) -> Result<()> {
        self.dev.bind()?;
        let (yp, zp, wp) = ((self.rd(y)?, y.len), (self.rd(zx)?, zx.len), (self.rd(w)?, w.len));
        let op = (self.wr(out), out.len);
        // the output projection's Q8 input written by the norm (no quantize launch)
        let q8 = if ssm::gated_norm_q8(p) { self.q8_out(op.0, out.len)? } else { (0, 0) };
        Ok(ssm::gated_norm(&self.dev, p, yp, zp, wp, op, q8)?)
    }
}
