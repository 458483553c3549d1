//! # quarrel-cpu: the CPU backend
//!
//! ```text
//!  x (n_tok, n_in) f32 ──quantize rows to W's vec_dot_type──► xq
//!  W Q4_0/Q4_K/IQ4_NL (AVX2+) ──repacked once into 16-row interleaved groups──►
//!                         one kernel for 1..N tokens (simd::repack), ──► out
//!  W other (mmapped GGUF rows) ─┬─ decode (few tokens): contiguous row runs per task, 8-row GEMV /
//!                         │    4-row / 1-row dot kernels ──► out
//!                         └─ prefill / many sequences: packed activation panels x weight
//!                              panels (packed once per weight; Q4_0/Q4_1 kept compact and
//!                              expanded per task), GEMM tiles; `matmul_many`: weights sharing
//!                              an input in one parallel job
//!  every kernel: run-time dispatched (AVX2 / AVX-512 / VNNI), else quant's reference twin
//! ```
//!
//! | module      | responsibility |
//! |-------------|----------------|
//! | `weight`    | `CpuWeight`: zero-copy views into the mmap; small vectors as f32; the repacked copy / GEMM panels made on first use |
//! | `actquant`  | activation quantization bit-compatible with ggml's x86 build |
//! | `ggml_math` | SiLU/exp bit-compatible with ggml's AVX-512 build (with scalar twins) |
//! | `matmul`    | quantize activations once per row; GEMV (decode) and GEMM (prefill) drivers |
//! | `matmul_amx`| F16 weights on the matrix units (AMX) for encoders (`set_matrix_units`) |
//! | `simd`      | run-time dispatched dot / GEMV / GEMM kernels, tested against `quarrel-quant`; `simd::repack`: 16-row interleaved Q4_0/Q4_K/IQ4_NL and their scalar twins |
//! | `attention` | paged causal attention with an online softmax, over the f16/f32 KV cache |
//! | `attention_amx` | encoders' attention on the matrix units (AMX): `Q Kᵀ`, softmax, `P V` per (sequence, head) |
//! | `pool`      | `SpinPool`: persistent workers with spin-then-sleep waits for per-op loops; one contiguous task range per thread (then the others' leftovers); the caller never waits for a worker that has not joined |
//! | `ops`       | embedding, RMSNorm, RoPE, SwiGLU, add, gather |
//! | `kv`        | `CpuKv`: per-layer paged K/V storage |
//! | `huge`      | zeroed buffers on transparent huge pages (kept panels, repacked weights, K/V stores) |
//! | `moe`       | MoE routing, grouped expert matmul over 3-D weights in place, combine |
//! | `ssm`       | Mamba2 conv1d / selective scan / gated norm over per-slot recurrent state |
//! | `tuning`    | the environment variables this crate reads (parsed once), `tuning_table()`, the tests' `set_repack` |
// Kernels index several arrays (lanes, accumulators, weights) by one counter; the index form
// keeps that mapping visible where an iterator chain would hide it.
#![allow(clippy::needless_range_loop)]

/// `fn $name($args)` running `$body($args)` with hardware FMA where the CPU has it:
/// `f32::mul_add` is a libm call otherwise (exactly fused as well, so the same bits, slower).
/// `$body` is `#[inline(always)]`, so the FMA twin compiles it with the feature.
macro_rules! fma_dispatch {
    ($(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) => $body:ident) => {
        $(#[$m])*
        fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "fma")]
            unsafe fn with_fma($($arg: $ty),*) {
                $body($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("fma") {
                // SAFETY: the CPU has FMA (checked above).
                return unsafe { with_fma($($arg),*) };
            }
            $body($($arg),*)
        }
    };
}

pub mod actquant;
mod attention;
mod attention_amx;
pub mod ggml_math;
mod huge;
mod kv;
mod matmul;
mod matmul_amx;
mod matmul_repacked;
pub mod moe;
mod ops;
pub mod pool;
pub mod simd;
pub mod ssm;
pub mod tuning;
mod weight;

pub use kv::CpuKv;
pub use weight::CpuWeight;

use quarrel_core::{
    AttnParams, Backend, CoreError, ForwardBatch, KvSpec, MoeRouting, QuantType, Result, RopeParams, Route, SsmParams, StateSpec,
    WeightSource,
};

/// The CPU backend: a thread pool and run-time selected kernels.
pub struct CpuBackend {
    spin: std::sync::Arc<pool::SpinPool>,
    n_threads: usize,
    /// Expert selections per (layer, expert), for metrics.
    moe_counts: std::sync::Mutex<Vec<Vec<u64>>>,
    /// Attention over f16 caches takes llama.cpp's vector path (f16 query, f16 V accumulator)
    /// for every sequence, so a token's logits do not depend on how many tokens its sequence
    /// brings to the batch (default); `false` (`QUARREL_CPU_ATTN=llama`,
    /// `set_batch_invariant_attention`): llama.cpp's choice, the f32 path for sequences of 64 or
    /// more tokens in the batch (`attention.rs`).
    batch_invariant_attn: std::sync::atomic::AtomicBool,
    /// F16 weights multiply on the CPU's matrix units where it has them (`set_matrix_units`).
    matrix_units: std::sync::atomic::AtomicBool,
}

impl CpuBackend {
    /// A backend with `n_threads` worker threads (0 = number of physical-ish cores).
    pub fn new(n_threads: usize) -> Result<CpuBackend> {
        let n = if n_threads == 0 { default_threads() } else { n_threads };
        let batch_invariant_attn = tuning::get().invariant_attn.into();
        Ok(CpuBackend {
            spin: std::sync::Arc::new(pool::SpinPool::new(n)),
            n_threads: n,
            moe_counts: Default::default(),
            batch_invariant_attn,
            matrix_units: false.into(),
        })
    }

    /// Another backend on this one's worker threads: for a second model that runs in turn
    /// with this one's (a speculative drafter), so that the idle pool's spinning workers do
    /// not take cores from the busy one.
    pub fn sharing_threads(&self) -> CpuBackend {
        CpuBackend {
            spin: self.spin.clone(),
            n_threads: self.n_threads,
            moe_counts: Default::default(),
            batch_invariant_attn: self.batch_invariant_attention().into(),
            matrix_units: self.matrix_units.load(std::sync::atomic::Ordering::Relaxed).into(),
        }
    }

    /// Attention over f16 caches: `true` (default) the f16 vector path for every sequence
    /// (prefill == decode at every prompt length); `false` llama.cpp's per-batch choice (the
    /// f32 path for sequences of 64+ tokens in the batch: llama.cpp's own long-prompt numerics).
    pub fn set_batch_invariant_attention(&self, on: bool) {
        self.batch_invariant_attn.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// F16 weights on the CPU's matrix units (Intel AMX), where it has them, at every token
    /// count (`matmul_amx`): several times the vector kernels' rate on prompts and encoder
    /// batches, with sums of the same exact products in another f32 order than llama.cpp's.
    /// For encoders, whose vectors are compared by cosine; off by default (decoders keep
    /// llama.cpp's float order, which their greedy texts follow). Set before the first matmul.
    pub fn set_matrix_units(&self, on: bool) {
        self.matrix_units.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether F16 weights run on the matrix units (asked for, and the CPU has them).
    pub fn matrix_units(&self) -> bool {
        self.matrix_units.load(std::sync::atomic::Ordering::Relaxed) && simd::amx::available()
    }

    pub(crate) fn batch_invariant_attention(&self) -> bool {
        self.batch_invariant_attn.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// The thread pool's profile counters (zero unless `QUARREL_CPU_PROFILE=1`).
    pub fn pool_stats(&self) -> pool::PoolStats {
        self.spin.stats()
    }

    /// `f(i, chunk_i)` over the `chunk`-sized pieces of `data`, in parallel on the spin pool.
    pub(crate) fn par_chunks_mut<T: Send>(&self, data: &mut [T], chunk: usize, f: &(dyn Fn(usize, &mut [T]) + Sync)) {
        let chunk = chunk.max(1);
        let n = data.len().div_ceil(chunk);
        let (ptr, len) = (data.as_mut_ptr() as usize, data.len());
        self.for_each_task(n, &|i| {
            let start = i * chunk;
            let end = (start + chunk).min(len);
            // SAFETY: tasks get disjoint [start, end) ranges of `data`, which outlives the call.
            let piece = unsafe { std::slice::from_raw_parts_mut((ptr as *mut T).add(start), end - start) };
            f(i, piece)
        });
    }

    /// A vector of `n` values written by `fill(offset, piece)` over its pieces: in parallel
    /// for large buffers on a pool of 2+ threads (a decode step of many sequences zeroes or
    /// copies a few MB per layer and step on the caller otherwise).
    fn filled(&self, n: usize, fill: &(dyn Fn(usize, &mut [std::mem::MaybeUninit<f32>]) + Sync)) -> Vec<f32> {
        const PAR_MIN: usize = 1 << 14;
        const PIECE: usize = 1 << 13;
        let mut v: Vec<f32> = Vec::with_capacity(n);
        let spare = &mut v.spare_capacity_mut()[..n];
        if self.n_threads > 1 && n >= PAR_MIN {
            self.par_chunks_mut(spare, PIECE, &|i, piece| fill(i * PIECE, piece));
        } else {
            fill(0, spare);
        }
        // SAFETY: `fill` wrote every one of the first n values (each piece exactly once).
        unsafe { v.set_len(n) };
        v
    }

    /// A copy of `src` ([`CpuBackend::filled`]).
    fn copied(&self, src: &[f32]) -> Vec<f32> {
        self.filled(src.len(), &|at, piece| {
            let len = piece.len();
            for (d, &s) in piece.iter_mut().zip(&src[at..at + len]) {
                d.write(s);
            }
        })
    }

    /// Run `f(0..n_tasks)` on the spin pool (the caller takes part).
    pub(crate) fn for_each_task(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        self.spin.run(n_tasks, f)
    }
}

/// Available parallelism, the default thread count.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(CoreError::Shape(format!("{what}: buffer has {got} elements, expected {want}")));
    }
    Ok(())
}

impl Backend for CpuBackend {
    type Buf = Vec<f32>;
    type Weight = CpuWeight;
    type Kv = CpuKv;

    fn name(&self) -> String {
        let amx = if self.matrix_units() { " + amx tiles" } else { "" };
        format!("cpu ({}{amx}, {} threads)", simd::features_string(), self.n_threads)
    }

    fn load_weight(&self, src: WeightSource<'_>) -> Result<CpuWeight> {
        CpuWeight::load(src)
    }

    fn weight_dims(&self, w: &CpuWeight) -> (usize, usize) {
        (w.n_in, w.n_out)
    }

    fn weight_type(&self, w: &CpuWeight) -> QuantType {
        w.ty
    }

    fn alloc(&self, n: usize) -> Result<Vec<f32>> {
        Ok(self.filled(n, &|_, out: &mut [std::mem::MaybeUninit<f32>]| {
            out.iter_mut().for_each(|v| {
                v.write(0.0);
            })
        }))
    }

    fn upload(&self, src: &[f32]) -> Result<Vec<f32>> {
        Ok(self.copied(src))
    }

    fn download(&self, src: &Vec<f32>) -> Result<Vec<f32>> {
        Ok(self.copied(src))
    }

    fn buf_len(&self, b: &Vec<f32>) -> usize {
        b.len()
    }

    fn alloc_kv(&self, spec: &KvSpec) -> Result<CpuKv> {
        CpuKv::new(spec)
    }

    fn embed(&self, table: &CpuWeight, tokens: &[u32], out: &mut Vec<f32>) -> Result<()> {
        ops::embed(table, tokens, out)
    }

    fn matmul(&self, w: &CpuWeight, x: &Vec<f32>, n_tok: usize, out: &mut Vec<f32>) -> Result<()> {
        check_len("matmul input", x.len(), n_tok * w.n_in)?;
        check_len("matmul output", out.len(), n_tok * w.n_out)?;
        matmul::matmul(self, w, x, n_tok, out)
    }

    fn matmul_many(&self, ws: &[&CpuWeight], x: &Vec<f32>, n_tok: usize, outs: &mut [&mut Vec<f32>]) -> Result<()> {
        check_len("matmul_many outputs", outs.len(), ws.len())?;
        for (w, o) in ws.iter().zip(outs.iter()) {
            check_len("matmul input", x.len(), n_tok * w.n_in)?;
            check_len("matmul output", o.len(), n_tok * w.n_out)?;
        }
        matmul::matmul_many(self, ws, x, n_tok, outs)
    }

    fn rms_norm(&self, x: &Vec<f32>, w: &CpuWeight, eps: f32, out: &mut Vec<f32>) -> Result<()> {
        check_len("rms_norm output", out.len(), x.len())?;
        ops::rms_norm(self, x, w, eps, out)
    }

    fn layer_norm(&self, x: &Vec<f32>, w: &CpuWeight, b: &CpuWeight, eps: f32, out: &mut Vec<f32>) -> Result<()> {
        check_len("layer_norm output", out.len(), x.len())?;
        ops::layer_norm(self, x, w, b, eps, out)
    }

    fn rope(&self, x: &mut Vec<f32>, positions: &[u32], n_head: usize, head_dim: usize, p: &RopeParams) -> Result<()> {
        check_len("rope input", x.len(), positions.len() * n_head * head_dim)?;
        ops::rope(self, x, positions, n_head, head_dim, p)
    }

    fn swiglu(&self, gate: &Vec<f32>, up: &Vec<f32>, out: &mut Vec<f32>) -> Result<()> {
        check_len("swiglu up", up.len(), gate.len())?;
        check_len("swiglu output", out.len(), gate.len())?;
        ops::swiglu(self, gate, up, out);
        Ok(())
    }

    fn geglu(&self, gate: &Vec<f32>, up: &Vec<f32>, out: &mut Vec<f32>) -> Result<()> {
        check_len("geglu up", up.len(), gate.len())?;
        check_len("geglu output", out.len(), gate.len())?;
        ops::geglu(self, gate, up, out);
        Ok(())
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>) -> Result<()> {
        check_len("add", y.len(), x.len())?;
        x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
        Ok(())
    }

    fn add_bias(&self, x: &mut Vec<f32>, b: &Vec<f32>) -> Result<()> {
        if b.is_empty() || !x.len().is_multiple_of(b.len()) {
            return Err(CoreError::Shape(format!("add_bias: {} values are not rows of {}", x.len(), b.len())));
        }
        x.chunks_exact_mut(b.len()).for_each(|row| row.iter_mut().zip(b).for_each(|(a, c)| *a += c));
        Ok(())
    }

    fn scale(&self, x: &mut Vec<f32>, s: f32) -> Result<()> {
        x.iter_mut().for_each(|a| *a *= s);
        Ok(())
    }

    fn gather_rows(&self, x: &Vec<f32>, dim: usize, rows: &[usize], out: &mut Vec<f32>) -> Result<()> {
        check_len("gather output", out.len(), rows.len() * dim)?;
        for (i, &r) in rows.iter().enumerate() {
            let src = x.get(r * dim..(r + 1) * dim).ok_or_else(|| CoreError::Shape(format!("gather row {r} out of range")))?;
            out[i * dim..(i + 1) * dim].copy_from_slice(src);
        }
        Ok(())
    }

    fn kv_store(&self, kv: &mut CpuKv, layer: usize, k: &Vec<f32>, v: &Vec<f32>, batch: &ForwardBatch) -> Result<()> {
        kv.store_on(self, layer, k, v, batch)
    }

    fn attention(
        &self,
        q: &Vec<f32>,
        kv: &CpuKv,
        layer: usize,
        batch: &ForwardBatch,
        p: &AttnParams,
        sinks: Option<&Vec<f32>>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        check_len("attention q", q.len(), batch.n_tokens() * p.n_head * p.head_dim)?;
        check_len("attention output", out.len(), q.len())?;
        attention::attention(self, q, kv, layer, batch, p, sinks.map(|s| s.as_slice()), out)
    }

    fn moe_route(&self, layer: usize, logits: &Vec<f32>, bias: Option<&Vec<f32>>, p: &MoeRouting) -> Result<Vec<Route>> {
        let routes = moe::moe_route(logits, bias.map(|b| b.as_slice()), p)?;
        let mut c = self.moe_counts.lock().unwrap_or_else(|e| e.into_inner());
        if c.len() <= layer {
            c.resize(layer + 1, vec![]);
        }
        let row = &mut c[layer];
        if row.len() < p.n_expert {
            row.resize(p.n_expert, 0);
        }
        routes.iter().for_each(|r| row[r.expert as usize] += 1);
        Ok(routes)
    }

    fn moe_selections(&self) -> Result<Vec<Vec<u64>>> {
        Ok(self.moe_counts.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    fn moe_matmul(
        &self,
        w: &CpuWeight,
        n_expert: usize,
        x: &Vec<f32>,
        routes: &[Route],
        x_per_token: bool,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        moe::moe_matmul(self, w, n_expert, x, routes, x_per_token, out)
    }

    fn moe_combine(&self, y: &Vec<f32>, routes: &[Route], out: &mut Vec<f32>) -> Result<()> {
        moe::moe_combine(y, routes, out)
    }

    fn moe_add_bias(&self, y: &mut Vec<f32>, bias: &Vec<f32>, routes: &[Route]) -> Result<()> {
        moe::moe_add_bias(y, bias, routes)
    }

    fn gelu(&self, x: &mut Vec<f32>) -> Result<()> {
        const CHUNK: usize = 1 << 13;
        self.par_chunks_mut(x, CHUNK, &|_, c| quarrel_core::act::gelu_ref(c));
        Ok(())
    }

    fn swiglu_oai(&self, gate: &Vec<f32>, up: &Vec<f32>, out: &mut Vec<f32>, alpha: f32, limit: f32) -> Result<()> {
        check_len("swiglu_oai up", up.len(), gate.len())?;
        check_len("swiglu_oai output", out.len(), gate.len())?;
        ops::swiglu_oai(self, gate, up, out, alpha, limit);
        Ok(())
    }

    fn relu_sqr(&self, x: &mut Vec<f32>) -> Result<()> {
        x.iter_mut().for_each(|v| {
            let r = v.max(0.0);
            *v = r * r
        });
        Ok(())
    }

    fn alloc_state(&self, kv: &mut CpuKv, spec: &StateSpec) -> Result<()> {
        for p in spec.layers.iter().flatten() {
            p.validate().map_err(CoreError::Model)?;
        }
        kv.state = Some(ssm::CpuState::new(spec)?);
        Ok(())
    }

    fn state_stats(&self, kv: &CpuKv) -> Result<(u64, u64)> {
        let st = kv.state.as_ref().ok_or_else(|| CoreError::Shape("the cache has no recurrent state".into()))?;
        let bytes = st.spec.bytes_per_slot() as u64 * st.spec.n_slots as u64;
        Ok((bytes, st.non_finite.load(std::sync::atomic::Ordering::Relaxed)))
    }

    fn state_copy(&self, kv: &mut CpuKv, src: usize, dst: usize) -> Result<()> {
        kv.state.as_mut().ok_or_else(|| CoreError::Shape("the cache has no recurrent state".into()))?.copy_slot(src, dst)
    }

    fn ssm_conv(
        &self,
        kv: &mut CpuKv,
        layer: usize,
        p: &SsmParams,
        zxbcdt: &Vec<f32>,
        w: &Vec<f32>,
        bias: Option<&Vec<f32>>,
        batch: &ForwardBatch,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        ssm::ssm_conv(kv, layer, p, zxbcdt, w, bias.map(|b| b.as_slice()), batch, out)
    }

    fn ssm_scan(
        &self,
        kv: &mut CpuKv,
        layer: usize,
        p: &SsmParams,
        xbc: &Vec<f32>,
        zxbcdt: &Vec<f32>,
        a: &Vec<f32>,
        d: &Vec<f32>,
        dt_bias: &Vec<f32>,
        batch: &ForwardBatch,
        y: &mut Vec<f32>,
    ) -> Result<u64> {
        let args = ssm::ScanArgs { p, xbc, zxbcdt, a, d, dt_bias };
        ssm::ssm_scan(self, kv, layer, &args, batch, y)
    }

    fn ssm_gated_norm(&self, p: &SsmParams, y: &Vec<f32>, zxbcdt: &Vec<f32>, w: &Vec<f32>, out: &mut Vec<f32>) -> Result<()> {
        ssm::ssm_gated_norm(self, p, y, zxbcdt, w, out)
    }
}
