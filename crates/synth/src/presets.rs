//! Real models' shapes, from their Hugging Face `config.json` files (and the GGUF metadata
//! llama.cpp's converter writes for them). Only the shapes and hyper-parameters are real:
//! weights and, unless `--vocab-from` is given, the vocabulary are synthetic.
//!
//! Not reproduced: Llama 3.2's `rope.scaling.type = llama3` and its `rope_freqs.weight`
//! tensor (the synthetic model uses plain RoPE with the real base frequency).

/// Shape and hyper-parameters of one model family member (`general.architecture = llama`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Preset {
    /// CLI name (`smollm2-135m`).
    pub name: &'static str,
    /// The model whose shapes these are, for `general.name` and help texts.
    pub model: &'static str,
    /// GGUF architecture; every preset here is `llama`.
    pub arch: &'static str,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    /// `{arch}.context_length`.
    pub n_ctx: usize,
    pub rope_freq_base: f32,
    pub rms_eps: f32,
    /// `output.weight` absent: the output projection reuses `token_embd.weight`.
    pub tied_embeddings: bool,
}

impl Preset {
    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }

    /// Width of the K and V projections (`n_head_kv * head_dim`).
    pub fn n_embd_kv(&self) -> usize {
        self.n_head_kv * self.head_dim()
    }

    /// Look a preset up by name (case-insensitive; `_` and `.` may stand for `-`).
    pub fn by_name(name: &str) -> Option<&'static Preset> {
        let norm = |s: &str| s.to_ascii_lowercase().replace('_', "-");
        let want = norm(name);
        PRESETS.iter().find(|p| norm(p.name) == want || norm(p.name).replace('.', "-") == want.replace('.', "-"))
    }

    /// The same preset with another block count (quick tests of big shapes).
    pub fn with_layers(mut self, n_layer: usize) -> Preset {
        self.n_layer = n_layer;
        self
    }
}

/// Every preset, smallest first.
pub fn presets() -> &'static [Preset] {
    PRESETS
}

const fn llama(
    name: &'static str,
    model: &'static str,
    dims: [usize; 7],
    rope_freq_base: f32,
    rms_eps: f32,
    tied_embeddings: bool,
) -> Preset {
    let [n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx] = dims;
    Preset {
        name,
        model,
        arch: "llama",
        n_embd,
        n_layer,
        n_head,
        n_head_kv,
        n_ff,
        n_vocab,
        n_ctx,
        rope_freq_base,
        rms_eps,
        tied_embeddings,
    }
}

//                                                  n_embd layers heads kv  n_ff   n_vocab  n_ctx
static PRESETS: &[Preset] = &[
    // A test model: K-quant friendly (rows of 256), GQA 2, head_dim 64, untied output.
    llama("tiny", "Quarrel tiny test model", [256, 2, 4, 2, 512, 512, 2048], 10_000.0, 1e-5, false),
    // HuggingFaceTB/SmolLM2-135M(-Instruct)
    llama("smollm2-135m", "SmolLM2 135M", [576, 30, 9, 3, 1536, 49_152, 8192], 100_000.0, 1e-5, true),
    // HuggingFaceTB/SmolLM2-360M(-Instruct)
    llama("smollm2-360m", "SmolLM2 360M", [960, 32, 15, 5, 2560, 49_152, 8192], 100_000.0, 1e-5, true),
    // TinyLlama/TinyLlama-1.1B-Chat-v1.0
    llama("tinyllama-1.1b", "TinyLlama 1.1B", [2048, 22, 32, 4, 5632, 32_000, 2048], 10_000.0, 1e-5, false),
    // meta-llama/Llama-3.2-1B(-Instruct)
    llama("llama-3.2-1b", "Llama 3.2 1B", [2048, 16, 32, 8, 8192, 128_256, 131_072], 500_000.0, 1e-5, true),
    // meta-llama/Llama-3.2-3B(-Instruct)
    llama("llama-3.2-3b", "Llama 3.2 3B", [3072, 28, 24, 8, 8192, 128_256, 131_072], 500_000.0, 1e-5, true),
    // meta-llama/Llama-2-7b(-hf)
    llama("llama-2-7b", "Llama 2 7B", [4096, 32, 32, 32, 11_008, 32_000, 4096], 10_000.0, 1e-5, false),
    // mistralai/Mistral-7B-Instruct-v0.2 (rope theta 1e6, no sliding window)
    llama("mistral-7b", "Mistral 7B v0.2", [4096, 32, 32, 8, 14_336, 32_000, 32_768], 1_000_000.0, 1e-5, false),
    // meta-llama/Meta-Llama-3-8B(-Instruct)
    llama("llama-3-8b", "Llama 3 8B", [4096, 32, 32, 8, 14_336, 128_256, 8192], 500_000.0, 1e-5, false),
    // meta-llama/Llama-3.1-8B(-Instruct)
    llama("llama-3.1-8b", "Llama 3.1 8B", [4096, 32, 32, 8, 14_336, 128_256, 131_072], 500_000.0, 1e-5, false),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_consistent() {
        for p in presets() {
            assert_eq!(p.n_embd % p.n_head, 0, "{}", p.name);
            assert_eq!(p.n_head % p.n_head_kv, 0, "{}", p.name);
            assert_eq!(p.head_dim() % 2, 0, "{}", p.name);
            assert!(p.n_vocab >= 259 + 64, "{}", p.name);
            assert_eq!(Preset::by_name(p.name), Some(p));
        }
        assert_eq!(Preset::by_name("TinyLlama_1.1B").unwrap().n_layer, 22);
        assert!(Preset::by_name("gpt-5").is_none());
    }
}
