//! The per-tensor types llama.cpp's `llama-quantize` picks for a file type, re-derived from
//! `src/llama-quant.cpp` (`tensor_allows_quantization`, `llama_tensor_get_type_impl`,
//! `tensor_type_fallback`), without an importance matrix:
//!
//! * Tensors with fewer than 2 dimensions, names not ending in `weight`, norms, expert
//!   routers, position / token-type embeddings and the small conv / RWKV / multimodal tensors
//!   are never quantized: they keep the type they have.
//! * F32 / F16 / BF16 file types: every other tensor has that type.
//! * `output.weight`, and `token_embd.weight` when the embeddings are tied (no
//!   `output.weight`), become Q6_K (Q8_0 in Q8_0 files, and Q8_0 when its rows are not a
//!   multiple of the default type's block); an untied `token_embd.weight` keeps the default.
//! * `attn_v` (also `attn_qkv`, `attn_kv_b`; counted over the file) and `ffn_down` (by layer)
//!   get more bits in the K mixes:
//!   - Q2_K: attn_v Q4_K if n_head/n_head_kv >= 4 else Q3_K; ffn_down and attn_output Q3_K.
//!   - Q2_K_S: attn_v Q4_K if GQA >= 4; ffn_down Q4_K in the first n_layer/8 layers.
//!   - Q3_K_M: attn_v Q5_K for the first 2, then Q4_K; ffn_down Q5_K in the first
//!     n_layer/16 layers, then Q4_K; attn_output Q4_K.
//!   - Q3_K_L: attn_v, ffn_down and attn_output Q5_K.
//!   - Q4_K_S: attn_v Q5_K for the first 4; ffn_down Q5_K in the first n_layer/8.
//!   - Q4_K_M, Q5_K_M: attn_v and ffn_down Q6_K where `use_more_bits(i, n)`: the first and
//!     last eighth and every third one in between.
//!   - IQ4_NL: attn_v Q5_K if GQA >= 4; ffn_down Q5_K in the first n_layer/8 layers.
//!   - Llama-70B-shaped models: attn_v Q3_K / Q4_K become Q5_K. Models with 8 experts:
//!     attn_v and attn_k Q8_0, attn_output Q5_K in the 2- to 4-bit K mixes and IQ4_NL.
//!   - Q3_K_S, Q5_K_S, Q6_K and the legacy types: nothing else changes.
//! * Shape fallback: a row length that is not a multiple of the chosen type's block gives
//!   Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, and F16 when even that
//!   does not divide (e.g. SmolLM2's 576-wide rows are never K-quantized).
//!
//! Falcon's own rules are left out (Quarrel does not run Falcon). An expert tensor whose name
//! has no `blk.N.` counts as the next layer, where llama.cpp stops with an error.

use crate::Ftype;
use quarrel_quant::QuantType;

/// What the type choice depends on besides the tensor itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MixParams {
    /// `{arch}.block_count`.
    pub n_layer: usize,
    /// `n_head / n_head_kv` of the first layer (0 when it has no KV heads).
    pub n_gqa: usize,
    /// `{arch}.expert_count` (0: dense).
    pub n_expert: usize,
    /// The `attn_v`, `attn_qkv` and `attn_kv_b` tensors of the file.
    pub n_attn_v: usize,
    /// No `output.weight`: `token_embd.weight` is quantized like the output.
    pub tied_embeddings: bool,
    /// llama.cpp's `LLM_TYPE_70B` (Llama / Qwen2 with 80 layers).
    pub is_70b: bool,
}

impl MixParams {
    /// A dense model with one `attn_v` per layer.
    pub fn dense(n_layer: usize, n_gqa: usize, tied_embeddings: bool) -> MixParams {
        MixParams { n_layer, n_gqa, n_expert: 0, n_attn_v: n_layer, tied_embeddings, is_70b: false }
    }
}

/// Choices a user makes over the mix (llama-quantize's flags of the same names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MixOverrides {
    /// `--output-tensor-type`: the type of `output.weight` (and of a tied `token_embd.weight`).
    pub output: Option<QuantType>,
    /// `--token-embedding-type`.
    pub token_embd: Option<QuantType>,
    /// false: `--leave-output-tensor` (output.weight keeps its type).
    pub quantize_output: bool,
}

impl Default for MixOverrides {
    fn default() -> Self {
        MixOverrides { output: None, token_embd: None, quantize_output: true }
    }
}

/// One tensor's planned type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    pub ty: QuantType,
    /// The mix's type when its block did not divide the rows and `ty` is the fallback.
    pub fallback_from: Option<QuantType>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    Output,
    TokenEmbd,
    AttnV,
    AttnK,
    AttnOutput,
    FfnDown,
    Other,
}

fn category(name: &str) -> Category {
    if name == "output.weight" {
        Category::Output
    } else if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        Category::TokenEmbd
    } else if name.contains("attn_qkv.weight") || name.contains("attn_kv_b.weight") || name.contains("attn_v.weight") {
        Category::AttnV
    } else if name.contains("attn_k.weight") {
        Category::AttnK
    } else if name.contains("attn_q.weight") || name.contains("ffn_up") || name.contains("ffn_gate") {
        // llama.cpp's own categories for these change types only in IQ mixes
        Category::Other
    } else if name.contains("attn_output.weight") {
        Category::AttnOutput
    } else if name.contains("ffn_down") {
        Category::FfnDown
    } else {
        Category::Other
    }
}

/// Name fragments of tensors llama-quantize never quantizes (besides norms and 1-D tensors).
const KEEP: &[&str] = &[
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
];

/// llama-quant.cpp's `tensor_allows_quantization`; `dims` in ggml order.
pub fn allows_quantization(name: &str, dims: &[u64], quantize_output: bool) -> bool {
    // ggml_n_dims: one past the last dimension larger than 1
    let n_dims = dims.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1);
    n_dims >= 2
        && name.ends_with("weight")
        && !name.contains("_norm.weight")
        && (quantize_output || name != "output.weight")
        && name != "position_embd.weight"
        && name != "token_types.weight"
        && !KEEP.iter().any(|k| name.contains(k))
}

/// llama-quant.cpp's `use_more_bits`.
fn use_more_bits(i: usize, n: usize) -> bool {
    let (i, n) = (i as i64, n as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The block number of `blk.N.*`.
fn block_index(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// Picks the type of each tensor in file order (the running counts of `attn_v` and
/// `ffn_down` tensors matter, as in llama-quantize).
pub struct MixPlanner {
    ftype: Ftype,
    p: MixParams,
    o: MixOverrides,
    i_attn_v: usize,
    i_ffn_down: usize,
}

impl MixPlanner {
    pub fn new(ftype: Ftype, p: MixParams) -> Self {
        Self::with_overrides(ftype, p, MixOverrides::default())
    }

    pub fn with_overrides(ftype: Ftype, p: MixParams, o: MixOverrides) -> Self {
        MixPlanner { ftype, p, o, i_attn_v: 0, i_ffn_down: 0 }
    }

    /// The type of the next tensor, `None` when it is not quantized (it keeps its type);
    /// `dims` in ggml order (`dims[0]` = row length).
    pub fn next(&mut self, name: &str, dims: &[u64]) -> Option<QuantType> {
        self.next_choice(name, dims).map(|c| c.ty)
    }

    /// [`next`](Self::next) with the type the fallback replaced, if any. An explicit
    /// `--output-tensor-type` / `--token-embedding-type` is returned as given, fitting or not.
    pub fn next_choice(&mut self, name: &str, dims: &[u64]) -> Option<Choice> {
        if !allows_quantization(name, dims, self.o.quantize_output) {
            return None;
        }
        let cat = category(name);
        let exact = |ty| Some(Choice { ty, fallback_from: None });
        match (cat, self.o.token_embd, self.o.output) {
            (Category::TokenEmbd, Some(t), _) | (Category::Output, _, Some(t)) => return exact(t),
            _ => {}
        }
        let default = self.ftype.default_type();
        if !default.is_quantized() {
            return exact(default);
        }
        let t = self.choose(name, cat, dims[0], default);
        let ty = fallback(t, dims[0]);
        Some(Choice { ty, fallback_from: (ty != t).then_some(t) })
    }

    fn choose(&mut self, name: &str, cat: Category, nx: u64, default: QuantType) -> QuantType {
        use Ftype as F;
        use QuantType as T;
        let ft = self.ftype;
        let p = self.p;
        if cat == Category::Output || (cat == Category::TokenEmbd && p.tied_embeddings) {
            return if let Some(t) = self.o.output {
                t
            } else if !nx.is_multiple_of(default.block_size() as u64) {
                T::Q8_0
            } else if default != T::Q8_0 {
                T::Q6_K
            } else {
                default
            };
        }
        let gqa4 = p.n_gqa >= 4;
        match cat {
            Category::AttnV => {
                let i = self.i_attn_v;
                self.i_attn_v += 1;
                let mut t = match ft {
                    F::Q2_K if gqa4 => T::Q4_K,
                    F::Q2_K => T::Q3_K,
                    F::Q2_K_S if gqa4 => T::Q4_K,
                    F::Q3_K_M if i < 2 => T::Q5_K,
                    F::Q3_K_M => T::Q4_K,
                    F::Q3_K_L => T::Q5_K,
                    F::IQ4_NL if gqa4 => T::Q5_K,
                    F::Q4_K_M | F::Q5_K_M if use_more_bits(i, p.n_attn_v) => T::Q6_K,
                    F::Q4_K_S if i < 4 => T::Q5_K,
                    _ => default,
                };
                if p.is_70b && matches!(t, T::Q3_K | T::Q4_K) {
                    t = T::Q5_K;
                }
                if p.n_expert == 8 {
                    t = T::Q8_0;
                }
                t
            }
            Category::AttnK if p.n_expert == 8 => T::Q8_0,
            Category::FfnDown => {
                let n = p.n_layer;
                let i = match block_index(name) {
                    Some(b) if p.n_expert > 1 => b,
                    _ => self.i_ffn_down,
                };
                self.i_ffn_down += 1;
                match ft {
                    F::Q2_K => T::Q3_K,
                    F::Q2_K_S if i < n / 8 => T::Q4_K,
                    F::Q3_K_M if i < n / 16 => T::Q5_K,
                    F::Q3_K_M => T::Q4_K,
                    F::Q3_K_L => T::Q5_K,
                    F::Q4_K_M | F::Q5_K_M if use_more_bits(i, n) => T::Q6_K,
                    F::IQ4_NL | F::Q4_K_S if i < n / 8 => T::Q5_K,
                    _ => default,
                }
            }
            Category::AttnOutput if p.n_expert == 8 => match ft {
                F::Q2_K | F::Q3_K_S | F::Q3_K_M | F::IQ4_NL | F::Q4_K_S | F::Q4_K_M => T::Q5_K,
                _ => default,
            },
            Category::AttnOutput => match ft {
                F::Q2_K => T::Q3_K,
                F::Q3_K_M => T::Q4_K,
                F::Q3_K_L => T::Q5_K,
                _ => default,
            },
            _ => default,
        }
    }
}

/// llama-quant.cpp's `tensor_type_fallback` for rows of `nx` elements.
pub fn fallback(t: QuantType, nx: u64) -> QuantType {
    use QuantType as T;
    if nx.is_multiple_of(t.block_size() as u64) {
        return t;
    }
    let f = match t {
        T::Q2_K | T::Q3_K => T::Q4_0,
        T::Q4_K => T::Q5_0,
        T::Q5_K => T::Q5_1,
        T::Q6_K => T::Q8_0,
        other => other,
    };
    if nx.is_multiple_of(f.block_size() as u64) {
        f
    } else {
        T::F16
    }
}

#[cfg(test)]
#[path = "mix_tests.rs"]
mod tests;
