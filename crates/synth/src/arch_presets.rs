//! The presets of [`crate::archs`]: tiny fixture models (one per architecture, every layer
//! kind, vocab 512) and full-size models with real shapes (from their Hugging Face
//! `config.json` files), each a row of [`ARCH_PRESETS`] over a llama-like [`BASE`].

/// Mamba2 mixer shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SsmShape {
    pub d_conv: usize,
    pub d_inner: usize,
    pub d_state: usize,
    pub n_group: usize,
    pub n_head: usize,
}

/// Granite's multipliers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GraniteScales {
    pub embedding: f32,
    pub residual: f32,
    pub attention: f32,
    pub logit: f32,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ArchPreset {
    pub name: &'static str,
    pub model: &'static str,
    pub arch: &'static str,
    pub pattern: &'static str,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Dense FFN width (llama/granite: also the per-expert width).
    pub n_ff: usize,
    pub n_vocab: usize,
    pub n_ctx: usize,
    pub n_expert: usize,
    pub n_used: usize,
    /// Per-expert width of nemotron_h_moe experts.
    pub n_ff_exp: usize,
    pub n_ff_shexp: usize,
    pub expert_norm: bool,
    pub expert_scale: f32,
    pub ssm: Option<SsmShape>,
    pub granite: Option<GraniteScales>,
    /// Sliding-window attention (gemma3, gpt-oss): `(window, pattern)`, every `pattern`-th layer
    /// global (gpt-oss files carry the window only: llama.cpp's default pattern for it is 2).
    pub swa: Option<(usize, usize)>,
    /// No `output.weight`: the output projection reuses `token_embd.weight`.
    pub tied: bool,
    /// YaRN context extension: `(rope.scaling.factor, rope.scaling.original_context_length)`.
    pub yarn: Option<(f32, usize)>,
    /// LongRoPE (Phi-3): `(rope.scaling.attn_factor, rope.scaling.original_context_length)`,
    /// with short and long frequency factors.
    pub longrope: Option<(f32, usize)>,
    /// Rotated dimensions per head (`rope.dimension_count`); 0: the whole head.
    pub n_rot: usize,
    /// Llama 3.1's RoPE frequency factors (`rope_freqs.weight`): `(factor, original context)`.
    pub llama3_rope: Option<(f32, u32)>,
    pub rope_freq_base: f32,
    pub rms_eps: f32,
    /// Encoders: a classification head scoring this many classes (`cls`, `cls.output`;
    /// llama.cpp's rank pooling: a reranker); 0 for none.
    pub n_cls_out: usize,
}

impl ArchPreset {
    pub fn n_layer(&self) -> usize {
        self.pattern.len()
    }
    pub(crate) fn single_mixer(&self) -> bool {
        matches!(self.arch, "nemotron_h" | "nemotron_h_moe" | "mamba2")
    }
    pub(crate) fn has_rope(&self) -> bool {
        !self.single_mixer()
    }
    /// Rotated dimensions per head.
    pub(crate) fn rot_dims(&self) -> usize {
        if self.n_rot == 0 {
            self.head_dim
        } else {
            self.n_rot
        }
    }
    /// Per-head RMSNorm of queries and keys.
    pub(crate) fn qk_norm(&self) -> bool {
        matches!(self.arch, "gemma3" | "qwen3" | "qwen3moe")
    }
    /// Width of each expert of a two-part block (`n_ff` unless `n_ff_exp` is set).
    pub(crate) fn expert_width(&self) -> usize {
        if self.n_ff_exp > 0 {
            self.n_ff_exp
        } else {
            self.n_ff
        }
    }
    pub fn by_name(name: &str) -> Option<&'static ArchPreset> {
        let want = name.to_ascii_lowercase().replace('_', "-");
        ARCH_PRESETS.iter().find(|p| p.name == want)
    }
    /// The tiny decoder presets (`tiny-*`: one small model per architecture) in table order,
    /// the order scripts/moe-fixtures.sh writes their llama.cpp fixtures in. Encoders (no
    /// logits) are not among them: `tiny-bert` has its own fixture.
    pub fn tiny() -> impl Iterator<Item = &'static ArchPreset> {
        ARCH_PRESETS.iter().filter(|p| p.name.starts_with("tiny-") && !p.is_encoder())
    }
    /// An encoder: hidden states, no logits.
    pub fn is_encoder(&self) -> bool {
        matches!(self.arch, "bert" | "nomic-bert")
    }
}

// BERT encoder (all-MiniLM / bge shape in small): post-norm blocks, learned positions,
// bidirectional attention, GELU feed-forward, biases everywhere
const TINY_BERT: ArchPreset = ArchPreset {
    name: "tiny-bert",
    model: "Quarrel tiny BERT encoder",
    arch: "bert",
    n_head_kv: 4,
    n_ff: 512,
    n_ctx: 512,
    rms_eps: 1e-12,
    ..BASE
};

// BERT-base (12 layers of 768, 12 heads, the 30,522-token uncased WordPiece vocabulary)
const BERT_BASE: ArchPreset =
    ArchPreset { pattern: "AAAAAAAAAAAA", n_embd: 768, n_head: 12, n_head_kv: 12, n_ff: 3072, n_vocab: 30_522, ..TINY_BERT };

const BASE: ArchPreset = ArchPreset {
    name: "",
    model: "",
    arch: "llama",
    pattern: "AA",
    n_embd: 256,
    n_head: 4,
    n_head_kv: 2,
    head_dim: 64,
    n_ff: 256,
    n_vocab: 512,
    n_ctx: 4096,
    n_expert: 0,
    n_used: 0,
    n_ff_exp: 0,
    n_ff_shexp: 0,
    expert_norm: false,
    expert_scale: 0.0,
    ssm: None,
    granite: None,
    swa: None,
    tied: false,
    yarn: None,
    longrope: None,
    n_rot: 0,
    llama3_rope: None,
    rope_freq_base: 10_000.0,
    rms_eps: 1e-5,
    n_cls_out: 0,
};

const TINY_SSM: SsmShape = SsmShape { d_conv: 4, d_inner: 512, d_state: 64, n_group: 2, n_head: 8 };
const GRANITE_SCALES: GraniteScales = GraniteScales { embedding: 12.0, residual: 0.22, attention: 0.0078125, logit: 8.0 };

const GPT_OSS_20B: ArchPreset = ArchPreset {
    name: "gpt-oss-20b",
    model: "GPT-OSS 20B",
    arch: "gpt-oss",
    pattern: "AAAAAAAAAAAAAAAAAAAAAAAA",
    n_embd: 2_880,
    n_head: 64,
    n_head_kv: 8,
    head_dim: 64,
    n_ff: 2_880,
    n_vocab: 201_088,
    n_ctx: 131_072,
    n_expert: 32,
    n_used: 4,
    n_ff_exp: 2_880,
    swa: Some((128, 2)),
    yarn: Some((32.0, 4_096)),
    rope_freq_base: 150_000.0,
    ..BASE
};

pub static ARCH_PRESETS: &[ArchPreset] = &[
    ArchPreset { name: "tiny-mixtral", model: "Quarrel tiny Mixtral-style MoE", n_expert: 4, n_used: 2, ..BASE },
    ArchPreset { name: "tiny-granite", model: "Quarrel tiny Granite", arch: "granite", granite: Some(GRANITE_SCALES), n_ff: 512, ..BASE },
    ArchPreset {
        name: "tiny-granitemoe",
        model: "Quarrel tiny Granite MoE",
        arch: "granitemoe",
        granite: Some(GRANITE_SCALES),
        n_expert: 4,
        n_used: 2,
        n_ff_shexp: 256,
        ..BASE
    },
    ArchPreset {
        name: "tiny-granitehybrid",
        model: "Quarrel tiny Granite 4 hybrid",
        arch: "granitehybrid",
        pattern: "MAMM",
        granite: Some(GRANITE_SCALES),
        n_expert: 4,
        n_used: 2,
        n_ff_shexp: 256,
        ssm: Some(SsmShape { n_group: 1, ..TINY_SSM }),
        ..BASE
    },
    ArchPreset { name: "tiny-mamba2", model: "Quarrel tiny Mamba2", arch: "mamba2", pattern: "MM", ssm: Some(TINY_SSM), ..BASE },
    ArchPreset {
        name: "tiny-nemotron-h",
        model: "Quarrel tiny Nemotron-H",
        arch: "nemotron_h",
        pattern: "M*M-",
        n_ff: 512,
        ssm: Some(TINY_SSM),
        ..BASE
    },
    ArchPreset {
        name: "tiny-nemotron-h-moe",
        model: "Quarrel tiny Nemotron-H MoE",
        arch: "nemotron_h_moe",
        pattern: "ME*E",
        n_expert: 8,
        n_used: 2,
        n_ff_exp: 256,
        n_ff_shexp: 512,
        expert_norm: true,
        expert_scale: 2.5,
        ssm: Some(TINY_SSM),
        ..BASE
    },
    // Gemma 3: head_dim 128 with n_head * head_dim != n_embd, one KV head, a 5-position window
    // with every 2nd layer global (the fixture's 16 tokens cross the window)
    ArchPreset {
        name: "tiny-gemma3",
        model: "Quarrel tiny Gemma 3",
        arch: "gemma3",
        pattern: "AAAA",
        n_head: 4,
        n_head_kv: 1,
        head_dim: 128,
        n_ff: 512,
        swa: Some((5, 2)),
        tied: true,
        rope_freq_base: 1_000_000.0,
        rms_eps: 1e-6,
        ..BASE
    },
    // Llama 3.1 / 3.2: rope_freqs factors over 64 original positions (pairs at 1, at the factor
    // and on the smooth ramp between), tied output
    ArchPreset {
        name: "tiny-llama3",
        model: "Quarrel tiny Llama 3",
        tied: true,
        llama3_rope: Some((8.0, 64)),
        rope_freq_base: 500_000.0,
        ..BASE
    },
    // Qwen2: q/k/v biases, tied output, NeoX RoPE
    ArchPreset {
        name: "tiny-qwen2",
        model: "Quarrel tiny Qwen2",
        arch: "qwen2",
        tied: true,
        rope_freq_base: 1_000_000.0,
        rms_eps: 1e-6,
        ..BASE
    },
    // Qwen2 with YaRN (factor 4 over 32 trained positions): the blend ramp spans the first
    // rotated pairs and the magnitude is 1 + 0.1 ln 4
    ArchPreset {
        name: "tiny-qwen2-yarn",
        model: "Quarrel tiny Qwen2 with YaRN",
        arch: "qwen2",
        tied: true,
        yarn: Some((4.0, 32)),
        rope_freq_base: 1_000_000.0,
        rms_eps: 1e-6,
        ..BASE
    },
    // Phi-3 / Phi-4-mini: fused q/k/v and gate/up, half the head rotated, LongRoPE over 32
    // original positions (the fixture's 64-token context takes the long factors). Not named
    // "Phi-3": llama.cpp then expects Phi-3's special tokens in the (synthetic) vocabulary.
    ArchPreset { name: "tiny-phi3", model: "Quarrel tiny Phi-style model", arch: "phi3", n_rot: 32, longrope: Some((1.19, 32)), ..BASE },
    // Nemotron (Nemotron-Mini): LayerNorms with biases, squared-ReLU MLP, half of each head rotated
    ArchPreset { name: "tiny-nemotron", model: "Quarrel tiny Nemotron", arch: "nemotron", n_rot: 32, n_ff: 512, ..BASE },
    // Qwen3: head_dim 128 with n_head * head_dim != n_embd, per-head q/k norms
    ArchPreset {
        name: "tiny-qwen3",
        model: "Quarrel tiny Qwen3",
        arch: "qwen3",
        head_dim: 128,
        n_ff: 512,
        rope_freq_base: 1_000_000.0,
        rms_eps: 1e-6,
        ..BASE
    },
    // Qwen3 MoE: 8 experts of their own width, 4 used, no shared expert
    ArchPreset {
        name: "tiny-qwen3moe",
        model: "Quarrel tiny Qwen3 MoE",
        arch: "qwen3moe",
        head_dim: 128,
        n_ff: 512,
        n_expert: 8,
        n_used: 4,
        n_ff_exp: 128,
        rope_freq_base: 1_000_000.0,
        rms_eps: 1e-6,
        ..BASE
    },
    // GPT-OSS: attention biases and sinks, sliding-window / full layers alternating (a window
    // of 8 positions: the fixture's 16 tokens cross it), YaRN, 8 MXFP4 experts with biases, 4
    // used, weighted by the softmax of the chosen logits, the clamped SwiGLU
    ArchPreset {
        name: "tiny-gpt-oss",
        model: "Quarrel tiny GPT-OSS",
        arch: "gpt-oss",
        pattern: "AAAA",
        n_ff: 128,
        n_expert: 8,
        n_used: 4,
        n_ff_exp: 128,
        swa: Some((8, 2)),
        yarn: Some((4.0, 32)),
        rope_freq_base: 150_000.0,
        ..BASE
    },
    TINY_BERT,
    // a BERT cross-encoder (bge-reranker / ms-marco-MiniLM shape in small): tiny-bert with a
    // classification head of one class, rank pooling
    ArchPreset { name: "tiny-bert-rerank", model: "Quarrel tiny BERT reranker", n_cls_out: 1, ..TINY_BERT },
    // nomic-embed in small: rotary positions, fused qkv, SwiGLU, no projection biases
    ArchPreset {
        name: "tiny-nomic-bert",
        model: "Quarrel tiny nomic-bert encoder",
        arch: "nomic-bert",
        rope_freq_base: 1000.0,
        ..TINY_BERT
    },
    // nomic-ai/nomic-embed-text-v1.5: BERT-base widths, rotary positions, a longer context
    ArchPreset {
        name: "nomic-embed-text-v1.5",
        model: "nomic-embed-text v1.5",
        arch: "nomic-bert",
        n_ctx: 2048,
        rope_freq_base: 1000.0,
        ..BERT_BASE
    },
    // BAAI/bge-base-en-v1.5
    ArchPreset { name: "bge-base-en-v1.5", model: "bge-base-en v1.5", ..BERT_BASE },
    // google/gemma-3-270m
    ArchPreset {
        name: "gemma-3-270m",
        model: "Gemma 3 270M",
        arch: "gemma3",
        pattern: "AAAAAAAAAAAAAAAAAA",
        n_embd: 640,
        n_head: 4,
        n_head_kv: 1,
        head_dim: 256,
        n_ff: 2048,
        n_vocab: 262_144,
        n_ctx: 32_768,
        swa: Some((512, 6)),
        tied: true,
        rope_freq_base: 1_000_000.0,
        rms_eps: 1e-6,
        ..BASE
    },
    // google/gemma-3-1b-it
    ArchPreset {
        name: "gemma-3-1b",
        model: "Gemma 3 1B",
        arch: "gemma3",
        pattern: "AAAAAAAAAAAAAAAAAAAAAAAAAA",
        n_embd: 1152,
        n_head: 4,
        n_head_kv: 1,
        head_dim: 256,
        n_ff: 6912,
        n_vocab: 262_144,
        n_ctx: 32_768,
        swa: Some((512, 6)),
        tied: true,
        rope_freq_base: 1_000_000.0,
        rms_eps: 1e-6,
        ..BASE
    },
    // Qwen/Qwen2.5-0.5B(-Instruct)
    ArchPreset {
        name: "qwen2.5-0.5b",
        model: "Qwen2.5 0.5B",
        arch: "qwen2",
        pattern: "AAAAAAAAAAAAAAAAAAAAAAAA",
        n_embd: 896,
        n_head: 14,
        n_head_kv: 2,
        head_dim: 64,
        n_ff: 4_864,
        n_vocab: 151_936,
        n_ctx: 32_768,
        tied: true,
        rope_freq_base: 1_000_000.0,
        rms_eps: 1e-6,
        ..BASE
    },
    // Qwen/Qwen2.5-7B(-Instruct)
    ArchPreset {
        name: "qwen2.5-7b",
        model: "Qwen2.5 7B",
        arch: "qwen2",
        pattern: "AAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        n_embd: 3_584,
        n_head: 28,
        n_head_kv: 4,
        head_dim: 128,
        n_ff: 18_944,
        n_vocab: 152_064,
        n_ctx: 32_768,
        tied: false,
        rope_freq_base: 1_000_000.0,
        rms_eps: 1e-6,
        ..BASE
    },
    // Qwen/Qwen3-0.6B
    ArchPreset {
        name: "qwen3-0.6b",
        model: "Qwen3 0.6B",
        arch: "qwen3",
        pattern: "AAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        n_embd: 1_024,
        n_head: 16,
        n_head_kv: 8,
        head_dim: 128,
        n_ff: 3_072,
        n_vocab: 151_936,
        n_ctx: 40_960,
        tied: true,
        rope_freq_base: 1_000_000.0,
        rms_eps: 1e-6,
        ..BASE
    },
    // Qwen/Qwen3-8B
    ArchPreset {
        name: "qwen3-8b",
        model: "Qwen3 8B",
        arch: "qwen3",
        pattern: "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        n_embd: 4_096,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 128,
        n_ff: 12_288,
        n_vocab: 151_936,
        n_ctx: 40_960,
        tied: false,
        rope_freq_base: 1_000_000.0,
        rms_eps: 1e-6,
        ..BASE
    },
    // Qwen/Qwen3-32B
    ArchPreset {
        name: "qwen3-32b",
        model: "Qwen3 32B",
        arch: "qwen3",
        pattern: "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        n_embd: 5_120,
        n_head: 64,
        n_head_kv: 8,
        head_dim: 128,
        n_ff: 25_600,
        n_vocab: 151_936,
        n_ctx: 40_960,
        tied: false,
        rope_freq_base: 1_000_000.0,
        rms_eps: 1e-6,
        ..BASE
    },
    // Qwen/Qwen3-30B-A3B (128 experts of 768, 8 used)
    ArchPreset {
        name: "qwen3-30b-a3b",
        model: "Qwen3 30B-A3B",
        arch: "qwen3moe",
        pattern: "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        n_embd: 2_048,
        n_head: 32,
        n_head_kv: 4,
        head_dim: 128,
        n_ff: 6_144,
        n_vocab: 151_936,
        n_ctx: 40_960,
        n_expert: 128,
        n_used: 8,
        n_ff_exp: 768,
        tied: false,
        rope_freq_base: 1_000_000.0,
        rms_eps: 1e-6,
        ..BASE
    },
    // openai/gpt-oss-20b (32 experts of 2880, 4 used; MXFP4 experts as published)
    GPT_OSS_20B,
    // openai/gpt-oss-120b (36 layers, 128 experts)
    ArchPreset {
        name: "gpt-oss-120b",
        model: "GPT-OSS 120B",
        pattern: "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        n_expert: 128,
        ..GPT_OSS_20B
    },
    // microsoft/Phi-3-mini-4k-instruct
    ArchPreset {
        name: "phi-3-mini",
        model: "Phi-3 mini 4k",
        arch: "phi3",
        pattern: "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        n_embd: 3072,
        n_head: 32,
        n_head_kv: 32,
        head_dim: 96,
        n_ff: 8192,
        n_vocab: 32_064,
        n_ctx: 4096,
        ..BASE
    },
    // microsoft/Phi-4-mini-instruct (3/4 of each head rotated, LongRoPE from 4k to 128k)
    ArchPreset {
        name: "phi-4-mini",
        model: "Phi-4 mini",
        arch: "phi3",
        pattern: "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        n_embd: 3072,
        n_head: 24,
        n_head_kv: 8,
        head_dim: 128,
        n_rot: 96,
        n_ff: 8192,
        n_vocab: 200_064,
        n_ctx: 131_072,
        tied: true,
        longrope: Some((1.190_238_3, 4096)),
        ..BASE
    },
    // nvidia/Nemotron-Mini-4B-Instruct
    ArchPreset {
        name: "nemotron-mini-4b",
        model: "Nemotron Mini 4B",
        arch: "nemotron",
        pattern: "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        n_embd: 3072,
        n_head: 24,
        n_head_kv: 8,
        head_dim: 128,
        n_rot: 64,
        n_ff: 9216,
        n_vocab: 256_000,
        n_ctx: 4096,
        ..BASE
    },
    // mistralai/Mixtral-8x7B-v0.1
    ArchPreset {
        name: "mixtral-8x7b",
        model: "Mixtral 8x7B",
        pattern: "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        n_embd: 4096,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 128,
        n_ff: 14_336,
        n_vocab: 32_000,
        n_ctx: 32_768,
        n_expert: 8,
        n_used: 2,
        rope_freq_base: 1_000_000.0,
        ..BASE
    },
    // ibm-granite/granite-4.0-micro (dense transformer)
    ArchPreset {
        name: "granite-4.0-micro",
        model: "Granite 4.0 Micro",
        arch: "granite",
        pattern: "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        n_embd: 2560,
        n_head: 40,
        n_head_kv: 8,
        head_dim: 64,
        n_ff: 8192,
        n_vocab: 100_352,
        n_ctx: 131_072,
        granite: Some(GraniteScales { embedding: 12.0, residual: 0.22, attention: 0.015625, logit: 10.0 }),
        rope_freq_base: 10_000_000.0,
        ..BASE
    },
    // ibm-granite/granite-4.0-h-micro (hybrid, dense FFN)
    ArchPreset {
        name: "granite-4.0-h-micro",
        model: "Granite 4.0 H Micro",
        arch: "granitehybrid",
        pattern: "MMMMMAMMMMMMMMMAMMMMMMMMMAMMMMMMMMMAMMMM",
        n_embd: 2048,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 64,
        n_ff: 8192,
        n_vocab: 100_352,
        n_ctx: 131_072,
        ssm: Some(SsmShape { d_conv: 4, d_inner: 4096, d_state: 128, n_group: 1, n_head: 64 }),
        granite: Some(GraniteScales { embedding: 12.0, residual: 0.22, attention: 0.015625, logit: 8.0 }),
        ..BASE
    },
    // ibm-granite/granite-4.0-h-tiny (hybrid, 64 experts, 6 active, shared expert)
    ArchPreset {
        name: "granite-4.0-h-tiny",
        model: "Granite 4.0 H Tiny",
        arch: "granitehybrid",
        pattern: "MMMMMAMMMMMMMMMAMMMMMMMMMAMMMMMMMMMAMMMM",
        n_embd: 1536,
        n_head: 12,
        n_head_kv: 4,
        head_dim: 128,
        n_ff: 512,
        n_vocab: 100_352,
        n_ctx: 131_072,
        n_expert: 64,
        n_used: 6,
        n_ff_shexp: 1024,
        ssm: Some(SsmShape { d_conv: 4, d_inner: 3072, d_state: 128, n_group: 1, n_head: 48 }),
        granite: Some(GraniteScales { embedding: 12.0, residual: 0.22, attention: 0.0078125, logit: 6.0 }),
        ..BASE
    },
    // nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B
    ArchPreset {
        name: "nemotron-3-nano-30b-a3b",
        model: "Nemotron 3 Nano 30B-A3B",
        arch: "nemotron_h_moe",
        pattern: "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
        n_embd: 2688,
        n_head: 32,
        n_head_kv: 2,
        head_dim: 128,
        n_ff: 0,
        n_vocab: 131_072,
        n_ctx: 262_144,
        n_expert: 128,
        n_used: 6,
        n_ff_exp: 1856,
        n_ff_shexp: 3712,
        expert_norm: true,
        expert_scale: 2.5,
        ssm: Some(SsmShape { d_conv: 4, d_inner: 4096, d_state: 128, n_group: 8, n_head: 64 }),
        ..BASE
    },
];
