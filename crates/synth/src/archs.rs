//! Synthetic models of the mixture-of-experts and hybrid Mamba2 architectures: Mixtral-style
//! `llama` with experts, `granite`, `granitemoe`, `granitehybrid`, `mamba2`, `nemotron_h`,
//! `nemotron_h_moe`; `gemma3` (per-head q/k norms, sandwich norms, GELU-gated FFN, tied
//! output, interleaved sliding-window attention); `qwen2` (q/k/v biases; YaRN metadata where
//! the preset has it), `qwen3` (per-head q/k norms, wide heads), `qwen3moe` (experts of their
//! own width in every layer), `phi3` (fused q/k/v and gate/up, partial rotation, LongRoPE
//! factors), `nemotron` (LayerNorms with biases, squared-ReLU MLP, partial rotation); and
//! `llama` with Llama 3.1's `rope_freqs` factors; `gpt-oss` (attention biases and sinks,
//! alternating sliding windows, experts with biases, MXFP4 experts). Tiny
//! presets (2-4 layers covering every layer kind of the arch, vocab 512) are the fixture
//! models; full-size presets carry real shapes for benchmarks.
//!
//! A preset's `pattern` has one character per layer:
//! * two-part blocks (llama, granite*): `A` attention + FFN, `M` Mamba2 + FFN;
//! * single-mixer blocks (nemotron_h*, mamba2): `M` Mamba2, `*` attention, `-` squared-ReLU
//!   MLP, `E` experts + shared expert.
//!
//! Tensor types (a simplification of llama-quantize for these archs): norms, 1-D tensors,
//! the router `ffn_gate_inp`, `exp_probs_b`, `ssm_conv1d`, `ssm_a`, `ssm_d` stay F32;
//! `output` (and tied `token_embd`) gets Q6_K (Q8_0 in Q8_0 files); every other matrix gets
//! the file type's default type, with llama-quantize's fallback where rows do not fit.

use super::{type_counts, vocab, write_plan, Ftype, Init, PlannedTensor, SynthError, WriteOptions, NORM_STD};
use quarrel_gguf::{QuantType, Value, ValueType};
use quarrel_models::quantize::fallback;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub use super::arch_presets::{ArchPreset, GraniteScales, SsmShape, ARCH_PRESETS};

fn check(p: &ArchPreset) -> Result<(), SynthError> {
    let bad = |m: String| Err(SynthError::Invalid(format!("preset {}: {m}", p.name)));
    let single = p.single_mixer();
    for c in p.pattern.chars() {
        let ok = if single {
            "M*-E".contains(c) && (p.arch != "mamba2" || c == 'M')
        } else {
            c == 'A' || (c == 'M' && p.arch == "granitehybrid")
        };
        if !ok {
            return bad(format!("layer kind {c:?} does not exist in {}", p.arch));
        }
    }
    if p.pattern.contains('M') && p.ssm.is_none() {
        return bad("Mamba2 layers without an SSM shape".into());
    }
    if let Some(s) = p.ssm {
        if s.d_inner % s.n_head != 0 || s.d_inner % s.n_group != 0 || s.n_head % s.n_group != 0 {
            return bad(format!("bad SSM shape {s:?}"));
        }
        if p.arch == "granitehybrid" && s.d_inner != 2 * p.n_embd {
            return bad("granitehybrid needs d_inner = 2 n_embd".into());
        }
    }
    if (p.pattern.contains('E') || (p.n_expert > 0 && !single)) && (p.n_used == 0 || p.n_used > p.n_expert) {
        return bad(format!("{} of {} experts", p.n_used, p.n_expert));
    }
    if p.n_head_kv == 0 || !p.n_head.is_multiple_of(p.n_head_kv) {
        return bad("bad head layout".into());
    }
    Ok(())
}

/// The tensors of a `bert` encoder: embeddings (token, learned position, token type) with
/// their LayerNorm, then post-norm blocks with biases everywhere; a `nomic-bert` encoder has
/// no learned positions, a fused `attn_qkv`, a SwiGLU feed-forward and no projection biases;
/// a reranker adds its classification head.
fn bert_tensors(p: &ArchPreset) -> Vec<(String, Vec<u64>, Init)> {
    let nomic = p.arch == "nomic-bert";
    let u = |v: usize| v as u64;
    let (e, ff) = (u(p.n_embd), u(p.n_ff));
    let norm = Init::Normal { mean: 1.0, std: NORM_STD };
    let bias = Init::Normal { mean: 0.0, std: 0.1 };
    let mat = |n_in: u64| Init::Normal { mean: 0.0, std: 1.0 / (n_in as f32).sqrt() };
    let mut l: Vec<(String, Vec<u64>, Init)> = vec![
        ("token_embd.weight".into(), vec![e, u(p.n_vocab)], mat(e)),
        ("token_types.weight".into(), vec![e, 2], mat(e)),
        ("token_embd_norm.weight".into(), vec![e], norm),
        ("token_embd_norm.bias".into(), vec![e], bias),
    ];
    if !nomic {
        l.insert(2, ("position_embd.weight".into(), vec![e, u(p.n_ctx)], mat(e)));
    }
    for i in 0..p.n_layer() {
        let mut push = |t: &str, dims: Vec<u64>, init: Init| l.push((format!("blk.{i}.{t}"), dims, init));
        if nomic {
            push("attn_qkv.weight", vec![e, 3 * e], mat(e));
            push("attn_output.weight", vec![e, e], mat(e));
        } else {
            for x in ["attn_q", "attn_k", "attn_v", "attn_output"] {
                push(&format!("{x}.weight"), vec![e, e], mat(e));
                push(&format!("{x}.bias"), vec![e], bias);
            }
        }
        push("attn_output_norm.weight", vec![e], norm);
        push("attn_output_norm.bias", vec![e], bias);
        push("ffn_up.weight", vec![e, ff], mat(e));
        if nomic {
            push("ffn_gate.weight", vec![e, ff], mat(e));
        } else {
            push("ffn_up.bias", vec![ff], bias);
        }
        push("ffn_down.weight", vec![ff, e], mat(ff));
        if !nomic {
            push("ffn_down.bias", vec![e], bias);
        }
        push("layer_output_norm.weight", vec![e], norm);
        push("layer_output_norm.bias", vec![e], bias);
    }
    if p.n_cls_out > 0 {
        let c = u(p.n_cls_out);
        l.push(("cls.weight".into(), vec![e, e], mat(e)));
        l.push(("cls.bias".into(), vec![e], bias));
        l.push(("cls.output.weight".into(), vec![e, c], mat(e)));
        l.push(("cls.output.bias".into(), vec![c], bias));
    }
    l
}

/// Tensors of `p` in file order: (name, ggml dims, init).
fn tensors(p: &ArchPreset) -> Vec<(String, Vec<u64>, Init)> {
    if p.is_encoder() {
        return bert_tensors(p);
    }
    let u = |v: usize| v as u64;
    let (e, v) = (u(p.n_embd), u(p.n_vocab));
    let resid = 1.0 / (2.0 * p.n_layer() as f32).sqrt();
    let norm = Init::Normal { mean: 1.0, std: NORM_STD };
    let mat = |n_in: u64, scale: f32| Init::Normal { mean: 0.0, std: scale / (n_in as f32).sqrt() };
    let mut l: Vec<(String, Vec<u64>, Init)> = vec![("token_embd.weight".into(), vec![e, v], mat(e, 1.0))];
    let (q, kv) = (u(p.n_head * p.head_dim), u(p.n_head_kv * p.head_dim));
    for (i, kind) in p.pattern.chars().enumerate() {
        let mut push = |t: &str, dims: Vec<u64>, init: Init| l.push((format!("blk.{i}.{t}"), dims, init));
        push("attn_norm.weight", vec![e], norm);
        let layer_norm = p.arch == "nemotron";
        let norm_bias = Init::Normal { mean: 0.0, std: 0.1 };
        if layer_norm {
            push("attn_norm.bias", vec![e], norm_bias);
        }
        match kind {
            'A' | '*' if p.arch == "phi3" => {
                push("attn_qkv.weight", vec![e, q + 2 * kv], mat(e, 1.0));
                push("attn_output.weight", vec![q, e], mat(q, resid));
            }
            'A' | '*' => {
                push("attn_q.weight", vec![e, q], mat(e, 1.0));
                push("attn_k.weight", vec![e, kv], mat(e, 1.0));
                push("attn_v.weight", vec![e, kv], mat(e, 1.0));
                push("attn_output.weight", vec![q, e], mat(q, resid));
                if p.arch == "qwen2" || p.arch == "gpt-oss" {
                    let bias = Init::Normal { mean: 0.0, std: 0.5 };
                    push("attn_q.bias", vec![q], bias);
                    push("attn_k.bias", vec![kv], bias);
                    push("attn_v.bias", vec![kv], bias);
                }
                if p.arch == "gpt-oss" {
                    push("attn_output.bias", vec![e], Init::Normal { mean: 0.0, std: 0.1 });
                    push("attn_sinks.weight", vec![u(p.n_head)], Init::Normal { mean: 1.0, std: 1.0 });
                    // gpt-oss names its pre-FFN norm so
                    push("post_attention_norm.weight", vec![e], norm);
                }
                if p.qk_norm() {
                    let hd = u(p.head_dim);
                    push("attn_q_norm.weight", vec![hd], norm);
                    push("attn_k_norm.weight", vec![hd], norm);
                }
                if p.arch == "gemma3" {
                    push("post_attention_norm.weight", vec![e], norm);
                }
            }
            'M' => {
                let s = p.ssm.expect("checked");
                let conv_dim = u(s.d_inner + 2 * s.n_group * s.d_state);
                let d_in_proj = u(2 * s.d_inner + 2 * s.n_group * s.d_state + s.n_head);
                let nh = u(s.n_head);
                push("ssm_in.weight", vec![e, d_in_proj], mat(e, 1.0));
                push("ssm_conv1d.weight", vec![u(s.d_conv), conv_dim], mat(u(s.d_conv), 1.0));
                push("ssm_conv1d.bias", vec![conv_dim], Init::Normal { mean: 0.0, std: 0.1 });
                // dt_bias = softplus⁻¹(dt) for dt around 0.02
                push("ssm_dt.bias", vec![nh], Init::Normal { mean: -4.0, std: 1.0 });
                push("ssm_a", vec![1, nh], Init::NegAbs { mean: 4.0, std: 3.0 });
                push("ssm_d", vec![1, nh], Init::Normal { mean: 1.0, std: 0.1 });
                push("ssm_norm.weight", vec![u(s.d_inner / s.n_group), u(s.n_group)], norm);
                push("ssm_out.weight", vec![u(s.d_inner), e], mat(u(s.d_inner), resid));
            }
            '-' => {
                let ff = u(p.n_ff);
                push("ffn_up.weight", vec![e, ff], mat(e, 1.0));
                push("ffn_down.weight", vec![ff, e], mat(ff, resid));
            }
            _ => {}
        }
        let two_part = !p.single_mixer();
        if two_part && p.arch != "gpt-oss" {
            push("ffn_norm.weight", vec![e], norm);
            if layer_norm {
                push("ffn_norm.bias", vec![e], norm_bias);
            }
        }
        let ne = u(p.n_expert);
        if two_part && p.n_expert == 0 && layer_norm {
            // Nemotron: ungated squared-ReLU MLP
            let ff = u(p.n_ff);
            push("ffn_up.weight", vec![e, ff], mat(e, 1.0));
            push("ffn_down.weight", vec![ff, e], mat(ff, resid));
        } else if two_part && p.n_expert == 0 && p.arch == "phi3" {
            let ff = u(p.n_ff);
            push("ffn_up.weight", vec![e, 2 * ff], mat(e, 1.0));
            push("ffn_down.weight", vec![ff, e], mat(ff, resid));
        } else if two_part && p.n_expert == 0 {
            let ff = u(p.n_ff);
            push("ffn_gate.weight", vec![e, ff], mat(e, 1.0));
            push("ffn_up.weight", vec![e, ff], mat(e, 1.0));
            push("ffn_down.weight", vec![ff, e], mat(ff, resid));
            if p.arch == "gemma3" {
                push("post_ffw_norm.weight", vec![e], norm);
            }
        } else if two_part {
            let ff = u(p.expert_width());
            push("ffn_gate_inp.weight", vec![e, ne], mat(e, 1.0));
            push("ffn_gate_exps.weight", vec![e, ff, ne], mat(e, 1.0));
            push("ffn_up_exps.weight", vec![e, ff, ne], mat(e, 1.0));
            push("ffn_down_exps.weight", vec![ff, e, ne], mat(ff, resid));
            if p.arch == "gpt-oss" {
                let bias = Init::Normal { mean: 0.0, std: 0.1 };
                push("ffn_gate_inp.bias", vec![ne], Init::Normal { mean: 0.0, std: 0.5 });
                push("ffn_gate_exps.bias", vec![ff, ne], bias);
                push("ffn_up_exps.bias", vec![ff, ne], bias);
                push("ffn_down_exps.bias", vec![e, ne], bias);
            }
            if p.n_ff_shexp > 0 {
                let fs = u(p.n_ff_shexp);
                push("ffn_gate_shexp.weight", vec![e, fs], mat(e, 1.0));
                push("ffn_up_shexp.weight", vec![e, fs], mat(e, 1.0));
                push("ffn_down_shexp.weight", vec![fs, e], mat(fs, resid));
            }
        } else if kind == 'E' {
            let (ff, fs) = (u(p.n_ff_exp), u(p.n_ff_shexp));
            push("ffn_gate_inp.weight", vec![e, ne], mat(e, 1.0));
            push("exp_probs_b.bias", vec![ne], Init::Normal { mean: 0.0, std: 0.05 });
            push("ffn_up_exps.weight", vec![e, ff, ne], mat(e, 1.0));
            push("ffn_down_exps.weight", vec![ff, e, ne], mat(ff, resid));
            push("ffn_up_shexp.weight", vec![e, fs], mat(e, 1.0));
            push("ffn_down_shexp.weight", vec![fs, e], mat(fs, resid));
        }
    }
    if let Some((factor, n_ctx_orig)) = p.llama3_rope {
        let freq_base = p.rope_freq_base;
        l.push(("rope_freqs.weight".into(), vec![u(p.rot_dims() / 2)], Init::Llama3RopeFactors { freq_base, factor, n_ctx_orig }));
    }
    if p.longrope.is_some() {
        // LongRoPE's per-pair divisors: above 1, the long ones larger
        let half = u(p.rot_dims() / 2);
        l.push(("rope_factors_long.weight".into(), vec![half], Init::Normal { mean: 6.0, std: 1.0 }));
        l.push(("rope_factors_short.weight".into(), vec![half], Init::Normal { mean: 1.5, std: 0.2 }));
    }
    l.push(("output_norm.weight".into(), vec![e], norm));
    if p.arch == "nemotron" {
        l.push(("output_norm.bias".into(), vec![e], Init::Normal { mean: 0.0, std: 0.1 }));
    }
    if !p.tied {
        l.push(("output.weight".into(), vec![e, v], mat(e, 1.0)));
    }
    l
}

fn tensor_type(arch: &str, name: &str, dims: &[u64], ftype: Ftype) -> QuantType {
    // token_types: llama.cpp adds a row of it as a view, which its CUDA backend takes in f32 only
    let keep_f32 = ["_norm.weight", "ffn_gate_inp.weight", "exp_probs_b", "ssm_conv1d", "ssm_a", "ssm_d", ".bias", "token_types.weight"];
    if dims.len() == 1 || keep_f32.iter().any(|k| name.contains(k)) {
        return QuantType::F32;
    }
    // GPT-OSS is published with MXFP4 experts whatever the other tensors' type
    if arch == "gpt-oss" && name.contains("_exps.weight") && dims[0].is_multiple_of(32) {
        return QuantType::MXFP4;
    }
    let default = ftype.default_type();
    let ty = if name == "output.weight" && !matches!(default, QuantType::F32 | QuantType::F16 | QuantType::BF16) {
        if ftype == Ftype::Q8_0 {
            QuantType::Q8_0
        } else {
            QuantType::Q6_K
        }
    } else {
        default
    };
    fallback(ty, dims[0])
}

/// The tensors of `p` typed for `ftype`.
pub fn arch_tensor_plan(p: &ArchPreset, ftype: Ftype) -> Vec<PlannedTensor> {
    tensors(p)
        .into_iter()
        .map(|(name, dims, init)| PlannedTensor { ty: tensor_type(p.arch, &name, &dims, ftype), name, dims, init })
        .collect()
}

fn metadata(p: &ArchPreset, ftype: Ftype, seed: u64, vocab: &vocab::Vocab) -> Vec<(String, Value)> {
    let a = p.arch;
    let k = |s: &str| format!("{a}.{s}");
    let u32v = |x: usize| Value::U32(x as u32);
    let arr = |f: &dyn Fn(char) -> usize| Value::Array(ValueType::U32, p.pattern.chars().map(|c| Value::U32(f(c) as u32)).collect());
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
        (k("block_count"), u32v(p.n_layer())),
        (k("context_length"), u32v(p.n_ctx)),
        (k("embedding_length"), u32v(p.n_embd)),
        (k("attention.layer_norm_rms_epsilon"), Value::F32(p.rms_eps)),
        (k("attention.layer_norm_epsilon"), Value::F32(p.rms_eps)),
        ("general.file_type".into(), Value::U32(ftype.llama_ftype())),
        (k("vocab_size"), u32v(p.n_vocab)),
    ];
    let attn_kv = |c: char| if c == 'A' || c == '*' { p.n_head_kv } else { 0 };
    match a {
        "mamba2" => {}
        "nemotron_h" | "nemotron_h_moe" => {
            kv.push((k("attention.head_count"), u32v(p.n_head)));
            kv.push((k("attention.head_count_kv"), arr(&attn_kv)));
            kv.push((k("attention.key_length"), u32v(p.head_dim)));
            kv.push((k("attention.value_length"), u32v(p.head_dim)));
            kv.push((k("attention.layer_norm_epsilon"), Value::F32(p.rms_eps)));
            let ff = |c: char| match c {
                '-' => p.n_ff,
                'E' => p.n_ff_exp,
                _ => 0,
            };
            kv.push((k("feed_forward_length"), arr(&ff)));
        }
        _ => {
            kv.push((k("attention.head_count"), u32v(p.n_head)));
            kv.push((k("attention.head_count_kv"), if p.pattern.contains('M') { arr(&attn_kv) } else { u32v(p.n_head_kv) }));
            kv.push((k("feed_forward_length"), u32v(p.n_ff)));
        }
    }
    if p.has_rope() {
        kv.push((k("rope.freq_base"), Value::F32(p.rope_freq_base)));
        kv.push((k("rope.dimension_count"), u32v(p.rot_dims())));
        if p.head_dim * p.n_head != p.n_embd {
            kv.push((k("attention.key_length"), u32v(p.head_dim)));
            kv.push((k("attention.value_length"), u32v(p.head_dim)));
        }
    }
    if let Some((attn_factor, n_ctx_orig)) = p.longrope {
        kv.push((k("rope.scaling.attn_factor"), Value::F32(attn_factor)));
        kv.push((k("rope.scaling.original_context_length"), u32v(n_ctx_orig)));
    }
    if let Some((factor, n_ctx_orig)) = p.yarn {
        kv.push((k("rope.scaling.type"), Value::String("yarn".into())));
        kv.push((k("rope.scaling.factor"), Value::F32(factor)));
        kv.push((k("rope.scaling.original_context_length"), u32v(n_ctx_orig)));
    }
    if let Some((window, pattern)) = p.swa {
        kv.push((k("attention.sliding_window"), u32v(window)));
        if a != "gpt-oss" {
            kv.push((k("attention.sliding_window_pattern"), u32v(pattern)));
        }
    }
    if let Some(g) = p.granite {
        kv.push((k("embedding_scale"), Value::F32(g.embedding)));
        kv.push((k("residual_scale"), Value::F32(g.residual)));
        kv.push((k("attention.scale"), Value::F32(g.attention)));
        kv.push((k("logit_scale"), Value::F32(g.logit)));
    }
    if p.n_expert > 0 {
        kv.push((k("expert_count"), u32v(p.n_expert)));
        kv.push((k("expert_used_count"), u32v(p.n_used)));
        if p.n_ff_shexp > 0 {
            kv.push((k("expert_shared_feed_forward_length"), u32v(p.n_ff_shexp)));
        }
        if p.n_ff_exp > 0 && !p.single_mixer() {
            kv.push((k("expert_feed_forward_length"), u32v(p.n_ff_exp)));
        }
        if p.single_mixer() {
            kv.push((k("expert_feed_forward_length"), u32v(p.n_ff_exp)));
            kv.push((k("expert_shared_count"), u32v(1)));
            kv.push((k("expert_weights_norm"), Value::Bool(p.expert_norm)));
            kv.push((k("expert_weights_scale"), Value::F32(p.expert_scale)));
        }
    }
    if p.is_encoder() {
        kv.push((k("attention.causal"), Value::Bool(false)));
        // llama.cpp's LLAMA_POOLING_TYPE_MEAN, or _RANK for a reranker
        kv.push((k("pooling_type"), Value::U32(if p.n_cls_out > 0 { 4 } else { 1 })));
        kv.push(("tokenizer.ggml.token_type_count".into(), Value::U32(2)));
    }
    if let Some(s) = p.ssm {
        kv.push((k("ssm.conv_kernel"), u32v(s.d_conv)));
        kv.push((k("ssm.inner_size"), u32v(s.d_inner)));
        kv.push((k("ssm.state_size"), u32v(s.d_state)));
        kv.push((k("ssm.time_step_rank"), u32v(s.n_head)));
        kv.push((k("ssm.group_count"), u32v(s.n_group)));
    }
    kv.extend(vocab.kv.iter().cloned());
    kv.push(("general.quantization_version".into(), Value::U32(2)));
    kv
}

/// What to write.
#[derive(Clone, Debug)]
pub struct ArchSynthSpec {
    pub preset: ArchPreset,
    pub ftype: Ftype,
    pub seed: u64,
    pub vocab_from: Option<PathBuf>,
}

impl ArchSynthSpec {
    /// Write this model, with its synthetic vocabulary, as `<preset>-<ftype>.gguf` in `dir`;
    /// returns the path.
    pub fn write_into(&self, dir: &Path) -> Result<PathBuf, SynthError> {
        let path = dir.join(format!("{}-{}.gguf", self.preset.name, self.ftype.name()));
        write_arch_synth(self, &path, &mut |_, _| {})?;
        Ok(path)
    }
}

/// What was written.
#[derive(Clone, Debug)]
pub struct ArchSummary {
    pub preset: ArchPreset,
    pub n_tensors: usize,
    pub n_params: u64,
    pub file_size: u64,
    pub seconds: f64,
    pub type_counts: Vec<(QuantType, usize)>,
}

/// Write the model `spec` describes to `out` (see [`super::write_synth`] for the format).
pub fn write_arch_synth(spec: &ArchSynthSpec, out: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<ArchSummary, SynthError> {
    write_arch_synth_with(spec, WriteOptions::default(), out, progress)
}

/// [`write_arch_synth`] with generation options.
pub fn write_arch_synth_with(
    spec: &ArchSynthSpec,
    opts: WriteOptions,
    out: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ArchSummary, SynthError> {
    let start = Instant::now();
    let mut p = spec.preset;
    check(&p)?;
    let vocab = vocab::load(spec.vocab_from.as_deref(), p.n_vocab)?;
    p.n_vocab = vocab.n_tokens;
    let plan = arch_tensor_plan(&p, spec.ftype);
    let meta = metadata(&p, spec.ftype, spec.seed, &vocab);
    let file_size = write_plan(&plan, meta, spec.seed, opts, out, progress)?;
    Ok(ArchSummary {
        preset: p,
        n_tensors: plan.len(),
        n_params: plan.iter().map(|t| t.n_elements()).sum(),
        file_size,
        seconds: start.elapsed().as_secs_f64(),
        type_counts: type_counts(&plan),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_consistent() {
        for p in ARCH_PRESETS {
            check(p).unwrap();
            assert_eq!(ArchPreset::by_name(p.name), Some(p));
        }
        assert_eq!(ArchPreset::by_name("nemotron-3-nano-30b-a3b").unwrap().n_layer(), 52);
    }

    #[test]
    fn types_follow_the_rules() {
        let p = ArchPreset::by_name("tiny-nemotron-h-moe").unwrap();
        let plan = arch_tensor_plan(p, Ftype::Q4_K_M);
        let ty = |n: &str| plan.iter().find(|t| t.name == n).unwrap().ty;
        assert_eq!(ty("blk.0.ssm_conv1d.weight"), QuantType::F32);
        assert_eq!(ty("blk.0.ssm_a"), QuantType::F32);
        assert_eq!(ty("blk.1.ffn_gate_inp.weight"), QuantType::F32);
        assert_eq!(ty("blk.1.ffn_up_exps.weight"), QuantType::Q4_K);
        assert_eq!(ty("output.weight"), QuantType::Q6_K);
        assert!(plan.iter().any(|t| t.name == "blk.1.exp_probs_b.bias"));
    }
}
