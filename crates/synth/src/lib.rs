//! # quarrel-synth: random-weights GGUF models with real models' shapes
//!
//! The writer behind `quarrel synth` and the tiny fixtures the tests of the other crates load
//! (a tool crate: the libraries never depend on it, their tests do).
//!
//! ```text
//!  SynthSpec { preset, ftype, seed, .. } ──plan──► tensor list (names, ggml dims, types: quarrel_models::quantize's mix)
//!       │                                   └──► metadata: general.*, llama.*, tokenizer.* (vocab.rs)
//!       └─ write_synth: header ─► per tensor, per chunk of rows (in parallel, rayon):
//!              row seed = f(seed, tensor name, row) ─► N(0, σ) (rng.rs) ─► quantize ─► file
//! ```
//!
//! | module    | responsibility |
//! |-----------|----------------|
//! | `archs`   | the other architectures (Mixtral-style MoE, Gemma 3, Granite, Nemotron-H, Mamba2, Qwen2, Qwen3, Qwen3-MoE): tensors and metadata |
//! | `arch_presets` | their tiny fixture models and full-size presets |
//! | `presets` | real models' shapes (SmolLM2, TinyLlama, Llama 2/3/3.2, Mistral) and `tiny` |
//! | `vocab`   | synthetic SPM vocabulary, or the `tokenizer.*` keys of a real model |
//! | `rng`     | SplitMix64 + Box-Muller, per-row seeds |
//!
//! The file is what llama.cpp's `convert_hf_to_gguf.py` + `llama-quantize` would write for
//! such a model: tensors `token_embd`, per block `attn_norm, attn_q, attn_k, attn_v,
//! attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down`, then `output_norm` and `output`
//! (absent when the embeddings are tied). The same spec gives a byte-identical file, however
//! many threads run: every row of every tensor has its own seed.
//!
//! Weight scales keep a forward pass numerically sane through any depth: a matrix with rows
//! of `n_in` elements is N(0, 1/sqrt(n_in)) (unit-variance outputs for unit-variance inputs),
//! the two projections that write into the residual stream (`attn_output`, `ffn_down`) are
//! further scaled by 1/sqrt(2 n_layer), and norm weights are 1 + N(0, 0.02).
//!
//! Tensor data are streamed in chunks of rows (at most [`CHUNK_BYTES`] at a time), so an
//! 8B model needs tens of megabytes of memory, not gigabytes.

pub mod arch_presets;
pub mod archs;
pub mod presets;
pub mod rng;
pub mod vocab;

pub use presets::{presets, Preset};
pub use quarrel_models::quantize::{MixParams, MixPlanner};
pub use quarrel_models::Ftype;

use quarrel_gguf::{GgufError, GgufWriter, QuantType, Value};
use rayon::prelude::*;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Upper bound on the quantized bytes produced (and buffered) per step.
pub const CHUNK_BYTES: usize = 32 << 20;

/// Standard deviation of norm weights around 1.
pub(crate) const NORM_STD: f32 = 0.02;

/// What to synthesize.
#[derive(Clone, Debug)]
pub struct SynthSpec {
    pub preset: Preset,
    pub ftype: Ftype,
    pub seed: u64,
    /// Replace the preset's block count (quick tests of big shapes).
    pub n_layer_override: Option<usize>,
    /// Copy every `tokenizer.*` key from this GGUF model (its token count becomes n_vocab).
    pub vocab_from: Option<PathBuf>,
}

impl SynthSpec {
    pub fn new(preset: Preset, ftype: Ftype) -> SynthSpec {
        SynthSpec { preset, ftype, seed: 0, n_layer_override: None, vocab_from: None }
    }

    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    pub fn layers(mut self, n_layer: usize) -> Self {
        self.n_layer_override = Some(n_layer);
        self
    }
}

/// What was written.
#[derive(Clone, Debug)]
pub struct SynthSummary {
    /// The preset as written (block count and vocabulary size as overridden).
    pub preset: Preset,
    pub ftype: Ftype,
    pub n_tensors: usize,
    pub n_params: u64,
    /// Bytes of the whole file.
    pub file_size: u64,
    pub seconds: f64,
    /// How many tensors got each type, in order of first appearance.
    pub type_counts: Vec<(QuantType, usize)>,
}

#[derive(Debug)]
pub enum SynthError {
    Io { path: PathBuf, source: std::io::Error },
    Gguf(GgufError),
    Quant { tensor: String, ty: QuantType, msg: String },
    Invalid(String),
}

impl std::fmt::Display for SynthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SynthError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            SynthError::Gguf(e) => write!(f, "{e}"),
            SynthError::Quant { tensor, ty, msg } => write!(f, "quantizing {tensor} to {ty}: {msg}"),
            SynthError::Invalid(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for SynthError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SynthError::Io { source, .. } => Some(source),
            SynthError::Gguf(e) => Some(e),
            _ => None,
        }
    }
}

impl From<GgufError> for SynthError {
    fn from(e: GgufError) -> Self {
        SynthError::Gguf(e)
    }
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// N(mean, std).
    Normal { mean: f32, std: f32 },
    /// -|N(mean, std)|: strictly non-positive values (Mamba2's `ssm_a` decay rates).
    NegAbs { mean: f32, std: f32 },
    /// Llama 3.1's `rope_freqs` (one row of `n_rot / 2` divisors), as llama.cpp's converter
    /// computes them from `rope_scaling`: 1 for short wavelengths, `factor` for long ones,
    /// smoothly between (low / high frequency factors 1 and 4 of `n_ctx_orig`).
    Llama3RopeFactors { freq_base: f32, factor: f32, n_ctx_orig: u32 },
}

/// The values of [`Init::Llama3RopeFactors`] for `n` pairs.
fn llama3_rope_factors(n: usize, freq_base: f32, factor: f32, n_ctx_orig: u32) -> Vec<f32> {
    let (low, high, ctx) = (1.0f64, 4.0f64, n_ctx_orig as f64);
    (0..n)
        .map(|i| {
            let freq = 1.0 / (freq_base as f64).powf(2.0 * i as f64 / (2 * n) as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let f = if wavelen < ctx / high {
                1.0
            } else if wavelen > ctx / low {
                factor as f64
            } else {
                let smooth = (ctx / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor as f64 + smooth)
            };
            f as f32
        })
        .collect()
}

/// One tensor of the file.
#[derive(Clone, Debug)]
pub struct PlannedTensor {
    pub name: String,
    /// ggml order: `dims[0]` is the row length.
    pub dims: Vec<u64>,
    pub ty: QuantType,
    pub init: Init,
}

impl PlannedTensor {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// The preset with the spec's overrides applied (block count; vocabulary size is applied
/// by [`write_synth`] once the vocabulary is known).
fn effective_preset(spec: &SynthSpec) -> Result<Preset, SynthError> {
    let mut p = spec.preset;
    if let Some(n) = spec.n_layer_override {
        if n == 0 || n > 512 {
            return Err(SynthError::Invalid(format!("block count {n} outside 1..=512")));
        }
        p = p.with_layers(n);
    }
    if p.n_head == 0 || p.n_head_kv == 0 || !p.n_embd.is_multiple_of(p.n_head) || !p.n_head.is_multiple_of(p.n_head_kv) {
        return Err(SynthError::Invalid(format!("bad head layout: n_embd {} n_head {} n_head_kv {}", p.n_embd, p.n_head, p.n_head_kv)));
    }
    Ok(p)
}

/// The tensors of a `llama` model with the shapes of `p`, in file order, typed for `ftype`.
pub fn tensor_plan(p: &Preset, ftype: Ftype) -> Vec<PlannedTensor> {
    let (e, kv, ff, v) = (p.n_embd as u64, p.n_embd_kv() as u64, p.n_ff as u64, p.n_vocab as u64);
    let resid = 1.0 / (2.0 * p.n_layer as f32).sqrt();
    let mut list: Vec<(String, Vec<u64>, f32)> = Vec::with_capacity(9 * p.n_layer + 3);
    list.push(("token_embd.weight".into(), vec![e, v], 1.0));
    for i in 0..p.n_layer {
        let b = |t: &str| format!("blk.{i}.{t}.weight");
        list.push((b("attn_norm"), vec![e], 1.0));
        list.push((b("attn_q"), vec![e, e], 1.0));
        list.push((b("attn_k"), vec![e, kv], 1.0));
        list.push((b("attn_v"), vec![e, kv], 1.0));
        list.push((b("attn_output"), vec![e, e], resid));
        list.push((b("ffn_norm"), vec![e], 1.0));
        list.push((b("ffn_gate"), vec![e, ff], 1.0));
        list.push((b("ffn_up"), vec![e, ff], 1.0));
        list.push((b("ffn_down"), vec![ff, e], resid));
    }
    list.push(("output_norm.weight".into(), vec![e], 1.0));
    if !p.tied_embeddings {
        list.push(("output.weight".into(), vec![e, v], 1.0));
    }
    let mut planner = MixPlanner::new(ftype, MixParams::dense(p.n_layer, p.n_head / p.n_head_kv, p.tied_embeddings));
    list.into_iter()
        .map(|(name, dims, scale)| {
            let ty = planner.next(&name, &dims).unwrap_or(QuantType::F32);
            let init = if dims.len() == 1 {
                Init::Normal { mean: 1.0, std: NORM_STD }
            } else {
                Init::Normal { mean: 0.0, std: scale / (dims[0] as f32).sqrt() }
            };
            PlannedTensor { name, dims, ty, init }
        })
        .collect()
}

/// Metadata of the file (everything but tensors), in the order llama.cpp's tools write it.
fn metadata(p: &Preset, ftype: Ftype, seed: u64, vocab: &vocab::Vocab) -> Vec<(String, Value)> {
    let a = p.arch;
    let mut kv: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        ("general.type".into(), Value::String("model".into())),
        ("general.name".into(), Value::String(format!("{} (synthetic)", p.model))),
        (
            "general.description".into(),
            Value::String(format!(
                "random weights with the shapes of {}, written by quarrel synth (preset {}, seed {seed})",
                p.model, p.name
            )),
        ),
        (format!("{a}.block_count"), Value::U32(p.n_layer as u32)),
        (format!("{a}.context_length"), Value::U32(p.n_ctx as u32)),
        (format!("{a}.embedding_length"), Value::U32(p.n_embd as u32)),
        (format!("{a}.feed_forward_length"), Value::U32(p.n_ff as u32)),
        (format!("{a}.attention.head_count"), Value::U32(p.n_head as u32)),
        (format!("{a}.attention.head_count_kv"), Value::U32(p.n_head_kv as u32)),
        (format!("{a}.rope.freq_base"), Value::F32(p.rope_freq_base)),
        (format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(p.rms_eps)),
        ("general.file_type".into(), Value::U32(ftype.llama_ftype())),
        (format!("{a}.vocab_size"), Value::U32(p.n_vocab as u32)),
        (format!("{a}.rope.dimension_count"), Value::U32(p.head_dim() as u32)),
    ];
    kv.extend(vocab.kv.iter().cloned());
    kv.push(("general.quantization_version".into(), Value::U32(2)));
    kv
}

/// How tensor data are generated.
#[derive(Clone, Copy, Debug, Default)]
pub struct WriteOptions {
    /// 0: every row is drawn and quantized on its own (byte-identical files for fixtures).
    /// N > 0: each tensor's first N rows are drawn and quantized as usual, and every other row
    /// is a copy of one of them, picked by the row's seed: valid quantized data with the
    /// same per-row statistics, written at disk speed (a 7B model in seconds instead of
    /// minutes). For benchmark shapes, whose speed does not depend on the values.
    pub row_pool: usize,
}

/// Counts the bytes written through it.
struct Counting<W> {
    inner: W,
    n: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Generate rows `r0..r0 + n` of `t` into `dst` (`n` rows of `row_bytes`), in parallel.
fn fill_rows(t: &PlannedTensor, tseed: u64, r0: u64, row_bytes: usize, dst: &mut [u8]) -> Result<(), SynthError> {
    let ne0 = t.dims[0] as usize;
    let (mean, std, neg_abs) = match t.init {
        Init::Normal { mean, std } => (mean, std, false),
        Init::NegAbs { mean, std } => (mean, std, true),
        Init::Llama3RopeFactors { freq_base, factor, n_ctx_orig } => {
            let row = llama3_rope_factors(ne0, freq_base, factor, n_ctx_orig);
            return dst.chunks_mut(row_bytes).try_for_each(|out| {
                quarrel_quant::quantize(t.ty, &row, out).map_err(|e| SynthError::Quant {
                    tensor: t.name.clone(),
                    ty: t.ty,
                    msg: e.to_string(),
                })
            });
        }
    };
    dst.par_chunks_mut(row_bytes).enumerate().with_min_len((16384 / ne0).max(1)).try_for_each_init(
        || vec![0f32; ne0],
        |row, (j, out)| {
            let mut r = rng::SplitMix64::new(rng::row_seed(tseed, r0 + j as u64));
            r.fill_normal(row, mean, std);
            if neg_abs {
                row.iter_mut().for_each(|v| *v = -v.abs());
            }
            quarrel_quant::quantize(t.ty, row, out).map_err(|e| SynthError::Quant { tensor: t.name.clone(), ty: t.ty, msg: e.to_string() })
        },
    )
}

/// Rows `r0..r0 + n` of a pooled tensor: copies of `pool` rows chosen by each row's seed.
fn fill_from_pool(pool: &[u8], tseed: u64, r0: u64, row_bytes: usize, dst: &mut [u8]) {
    let n_pool = pool.len() / row_bytes;
    dst.par_chunks_mut(row_bytes).enumerate().with_min_len(64).for_each(|(j, out)| {
        let r = r0 + j as u64;
        let k = if (r as usize) < n_pool { r as usize } else { (rng::mix64(rng::row_seed(tseed, r)) % n_pool as u64) as usize };
        out.copy_from_slice(&pool[k * row_bytes..(k + 1) * row_bytes]);
    });
}

/// The `tiny` preset at `ftype` with `seed`, written to `out`: the small model tests load.
pub fn write_tiny(out: &Path, ftype: Ftype, seed: u64) -> Result<SynthSummary, SynthError> {
    let preset = *Preset::by_name("tiny").expect("the tiny preset exists");
    write_synth(&SynthSpec::new(preset, ftype).seed(seed), out, &mut |_, _| {})
}

/// Write the model `spec` describes to `out`. `progress(done, total)` is called with tensor
/// data bytes after every chunk. The file appears under its name only when complete.
pub fn write_synth(spec: &SynthSpec, out: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<SynthSummary, SynthError> {
    write_synth_with(spec, WriteOptions::default(), out, progress)
}

/// [`write_synth`] with generation options.
pub fn write_synth_with(
    spec: &SynthSpec,
    opts: WriteOptions,
    out: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SynthSummary, SynthError> {
    let start = Instant::now();
    let mut p = effective_preset(spec)?;
    if p.arch != "llama" {
        return Err(SynthError::Invalid(format!("architecture {:?} is not supported (only llama)", p.arch)));
    }
    let vocab = vocab::load(spec.vocab_from.as_deref(), p.n_vocab)?;
    p.n_vocab = vocab.n_tokens;
    let plan = tensor_plan(&p, spec.ftype);
    let meta = metadata(&p, spec.ftype, spec.seed, &vocab);
    drop(vocab);
    let file_size = write_plan(&plan, meta, spec.seed, opts, out, progress)?;

    Ok(SynthSummary {
        preset: p,
        ftype: spec.ftype,
        n_tensors: plan.len(),
        n_params: plan.iter().map(|t| t.n_elements()).sum(),
        file_size,
        seconds: start.elapsed().as_secs_f64(),
        type_counts: type_counts(&plan),
    })
}

/// Write `meta` and the tensors of `plan` (values drawn per row from `seed`) to `out`;
/// returns the file size. The file appears under its name only when complete.
pub fn write_plan(
    plan: &[PlannedTensor],
    meta: Vec<(String, Value)>,
    seed: u64,
    opts: WriteOptions,
    out: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64, SynthError> {
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.set(&k, v);
    }
    for t in plan {
        w.add_tensor(&t.name, &t.dims, t.ty)?;
    }
    let infos = w.tensors().to_vec();
    let total: u64 = infos.iter().map(|t| t.n_bytes).sum();
    let align = quarrel_gguf::DEFAULT_ALIGNMENT;

    let tmp = partial_path(out);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SynthError::Io { path, source }
    };
    let file = File::create(&tmp).map_err(io(&tmp))?;
    let result = (|| -> Result<u64, SynthError> {
        let mut f = Counting { inner: BufWriter::with_capacity(4 << 20, file), n: 0 };
        // The header goes through GgufWriter; tensor data are streamed below in chunks of
        // rows at the offsets it assigned (TensorSink takes whole tensors only, and the
        // largest tensors are gigabytes).
        drop(w.write_header(&mut f)?);
        let data_start = f.n;
        let mut buf: Vec<u8> = Vec::new();
        let mut done = 0u64;
        progress(0, total);
        for (t, info) in plan.iter().zip(&infos) {
            debug_assert_eq!(f.n - data_start, info.offset);
            if f.n - data_start != info.offset {
                return Err(SynthError::Invalid(format!("{}: data offset mismatch", t.name)));
            }
            let ne0 = t.dims[0] as usize;
            let n_rows = (t.n_elements() / ne0 as u64) as usize;
            let row_bytes =
                t.ty.row_bytes(ne0).ok_or_else(|| SynthError::Invalid(format!("{}: rows of {ne0} do not fit type {}", t.name, t.ty)))?;
            let tseed = rng::tensor_seed(seed, &t.name);
            let rows_per_chunk = (CHUNK_BYTES / row_bytes).max(1);
            let pool = if opts.row_pool > 0 && n_rows > opts.row_pool {
                let mut pool = vec![0u8; opts.row_pool * row_bytes];
                fill_rows(t, tseed, 0, row_bytes, &mut pool)?;
                Some(pool)
            } else {
                None
            };
            let mut r0 = 0usize;
            while r0 < n_rows {
                let n = rows_per_chunk.min(n_rows - r0);
                buf.resize(n * row_bytes, 0);
                match &pool {
                    Some(pool) => fill_from_pool(pool, tseed, r0 as u64, row_bytes, &mut buf),
                    None => fill_rows(t, tseed, r0 as u64, row_bytes, &mut buf)?,
                }
                f.write_all(&buf).map_err(io(&tmp))?;
                done += buf.len() as u64;
                progress(done, total);
                r0 += n;
            }
            let pad = info.n_bytes.div_ceil(align) * align - info.n_bytes;
            f.write_all(&vec![0u8; pad as usize]).map_err(io(&tmp))?;
        }
        f.flush().map_err(io(&tmp))?;
        let n = f.n;
        let file = f.inner.into_inner().map_err(|e| SynthError::Io { path: tmp.clone(), source: e.into_error() })?;
        file.sync_all().map_err(io(&tmp))?;
        Ok(n)
    })();
    let file_size = match result {
        Ok(n) => n,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    std::fs::rename(&tmp, out).map_err(io(out))?;

    Ok(file_size)
}

/// How many tensors got each type, in order of first appearance.
pub fn type_counts(plan: &[PlannedTensor]) -> Vec<(QuantType, usize)> {
    let mut type_counts: Vec<(QuantType, usize)> = Vec::new();
    for t in plan {
        match type_counts.iter_mut().find(|(ty, _)| *ty == t.ty) {
            Some(c) => c.1 += 1,
            None => type_counts.push((t.ty, 1)),
        }
    }
    type_counts
}

fn partial_path(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".partial");
    PathBuf::from(s)
}
