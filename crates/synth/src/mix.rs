//! The per-tensor types llama.cpp's `llama-quantize` picks for a file type (`Ftype`, whose
//! table is `quarrel_models::Ftype`), re-derived from `src/llama-quant.cpp` (`llama_tensor_get_type_impl`,
//! `tensor_type_fallback`, `tensor_allows_quantization`) for dense `llama` models without
//! an importance matrix and without user overrides:
//!
//! * 1-D tensors and `*_norm.weight` keep F32.
//! * F32 / F16 / BF16 files: every other tensor has that type.
//! * `output.weight` — and `token_embd.weight` when the embeddings are tied — becomes Q6_K
//!   (Q8_0 in Q8_0 files, and Q8_0 when its rows are not a multiple of the default type's
//!   block); an untied `token_embd.weight` keeps the default type.
//! * `attn_v` (counted over layers) and `ffn_down` get more bits in the K mixes:
//!   - Q2_K: attn_v Q4_K if n_head/n_head_kv >= 4 else Q3_K; ffn_down and attn_output Q3_K.
//!   - Q2_K_S: attn_v Q4_K if GQA >= 4; ffn_down Q4_K in the first n_layer/8 layers.
//!   - Q3_K_M: attn_v Q5_K in the first 2 layers, then Q4_K; ffn_down Q5_K in the first
//!     n_layer/16 layers, then Q4_K; attn_output Q4_K.
//!   - Q3_K_L: attn_v, ffn_down and attn_output Q5_K.
//!   - Q4_K_S: attn_v Q5_K in the first 4 layers; ffn_down Q5_K in the first n_layer/8.
//!   - Q4_K_M, Q5_K_M: attn_v and ffn_down Q6_K where `use_more_bits(i, n)`: the first and
//!     last eighth of the layers and every third layer in between.
//!   - IQ4_NL: attn_v Q5_K if GQA >= 4; ffn_down Q5_K in the first n_layer/8 layers.
//!   - Q3_K_S, Q5_K_S, Q6_K and the legacy types: nothing else changes.
//! * Shape fallback: a row length that is not a multiple of the chosen type's block gives
//!   Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, and F16 when even that
//!   does not divide (e.g. SmolLM2's 576-wide rows are never K-quantized).
//!
//! Omitted: the 70B (`LLM_TYPE_70B`) and 8-expert special cases, which no preset reaches.

pub use quarrel_models::Ftype;
use quarrel_quant::QuantType;

/// What the type choice depends on besides the tensor itself.
#[derive(Clone, Copy, Debug)]
pub struct MixParams {
    pub n_layer: usize,
    /// `n_head / n_head_kv`.
    pub n_gqa: usize,
    /// No `output.weight`: `token_embd.weight` is quantized like the output.
    pub tied_embeddings: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    Output,
    TokenEmbd,
    AttnV,
    AttnOutput,
    FfnDown,
    Other,
}

fn category(name: &str) -> Category {
    if name == "output.weight" {
        Category::Output
    } else if name == "token_embd.weight" {
        Category::TokenEmbd
    } else if name.contains("attn_v.weight") {
        Category::AttnV
    } else if name.contains("attn_output.weight") {
        Category::AttnOutput
    } else if name.contains("ffn_down") {
        Category::FfnDown
    } else {
        Category::Other
    }
}

/// llama-quant.cpp's `use_more_bits`.
fn use_more_bits(i: usize, n: usize) -> bool {
    let (i, n) = (i as i64, n as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// Picks the type of each tensor in file order (the counters of `attn_v` and `ffn_down`
/// tensors seen so far matter, as in llama-quantize).
pub struct MixPlanner {
    ftype: Ftype,
    p: MixParams,
    i_attn_v: usize,
    i_ffn_down: usize,
}

impl MixPlanner {
    pub fn new(ftype: Ftype, p: MixParams) -> Self {
        MixPlanner { ftype, p, i_attn_v: 0, i_ffn_down: 0 }
    }

    /// The type of the next tensor; `dims` in ggml order (`dims[0]` = row length).
    pub fn next(&mut self, name: &str, dims: &[u64]) -> QuantType {
        // ggml_n_dims: one past the last dimension larger than 1
        let n_dims = dims.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1);
        let quantizable = n_dims >= 2 && name.ends_with("weight") && !name.contains("_norm.weight");
        if !quantizable {
            return QuantType::F32;
        }
        let default = self.ftype.default_type();
        if !default.is_quantized() {
            return default;
        }
        let t = self.choose(name, dims[0], default);
        fallback(t, dims[0])
    }

    fn choose(&mut self, name: &str, nx: u64, default: QuantType) -> QuantType {
        use Ftype as F;
        use QuantType as T;
        let ft = self.ftype;
        let n = self.p.n_layer;
        let cat = category(name);
        if cat == Category::Output || (cat == Category::TokenEmbd && self.p.tied_embeddings) {
            return if !nx.is_multiple_of(default.block_size() as u64) {
                T::Q8_0
            } else if default != T::Q8_0 {
                T::Q6_K
            } else {
                default
            };
        }
        match cat {
            Category::AttnV => {
                let i = self.i_attn_v;
                self.i_attn_v += 1;
                let gqa4 = self.p.n_gqa >= 4;
                match ft {
                    F::Q2_K => {
                        if gqa4 {
                            T::Q4_K
                        } else {
                            T::Q3_K
                        }
                    }
                    F::Q2_K_S if gqa4 => T::Q4_K,
                    F::Q3_K_M => {
                        if i < 2 {
                            T::Q5_K
                        } else {
                            T::Q4_K
                        }
                    }
                    F::Q3_K_L => T::Q5_K,
                    F::IQ4_NL if gqa4 => T::Q5_K,
                    F::Q4_K_M | F::Q5_K_M if use_more_bits(i, n) => T::Q6_K,
                    F::Q4_K_S if i < 4 => T::Q5_K,
                    _ => default,
                }
            }
            Category::FfnDown => {
                let i = self.i_ffn_down;
                self.i_ffn_down += 1;
                match ft {
                    F::Q2_K => T::Q3_K,
                    F::Q2_K_S if i < n / 8 => T::Q4_K,
                    F::Q3_K_M => {
                        if i < n / 16 {
                            T::Q5_K
                        } else {
                            T::Q4_K
                        }
                    }
                    F::Q3_K_L => T::Q5_K,
                    F::Q4_K_M | F::Q5_K_M if use_more_bits(i, n) => T::Q6_K,
                    F::IQ4_NL | F::Q4_K_S if i < n / 8 => T::Q5_K,
                    _ => default,
                }
            }
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
pub(crate) fn fallback(t: QuantType, nx: u64) -> QuantType {
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
mod tests {
    use super::*;
    use QuantType as T;

    fn plan(ft: Ftype, n_layer: usize, n_gqa: usize, tied: bool, nx: u64) -> Vec<(String, QuantType)> {
        let mut p = MixPlanner::new(ft, MixParams { n_layer, n_gqa, tied_embeddings: tied });
        let mut names = vec![("token_embd.weight".to_string(), vec![nx, 1000])];
        for i in 0..n_layer {
            for t in ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"] {
                let dims = if t.ends_with("norm") { vec![nx] } else { vec![nx, nx] };
                names.push((format!("blk.{i}.{t}.weight"), dims));
            }
        }
        names.push(("output_norm.weight".into(), vec![nx]));
        if !tied {
            names.push(("output.weight".into(), vec![nx, 1000]));
        }
        names
            .into_iter()
            .map(|(n, d)| {
                let t = p.next(&n, &d);
                (n, t)
            })
            .collect()
    }

    fn ty(p: &[(String, QuantType)], name: &str) -> QuantType {
        p.iter().find(|(n, _)| n == name).unwrap().1
    }

    #[test]
    fn q4_k_m_like_llama_quantize() {
        // 32 layers: use_more_bits is true for 0..4, 28..32 and 6, 9, 12, ..., 27
        let p = plan(Ftype::Q4_K_M, 32, 4, false, 4096);
        assert_eq!(ty(&p, "token_embd.weight"), T::Q4_K);
        assert_eq!(ty(&p, "output.weight"), T::Q6_K);
        assert_eq!(ty(&p, "output_norm.weight"), T::F32);
        assert_eq!(ty(&p, "blk.0.attn_norm.weight"), T::F32);
        for (i, more) in [(0, true), (3, true), (4, false), (5, false), (6, true), (7, false), (27, true), (28, true), (31, true)] {
            let want = if more { T::Q6_K } else { T::Q4_K };
            assert_eq!(ty(&p, &format!("blk.{i}.attn_v.weight")), want, "layer {i}");
            assert_eq!(ty(&p, &format!("blk.{i}.ffn_down.weight")), want, "layer {i}");
            assert_eq!(ty(&p, &format!("blk.{i}.attn_q.weight")), T::Q4_K);
        }
    }

    #[test]
    fn tied_and_fallbacks() {
        // SmolLM2-135M at Q4_1: tied token_embd -> Q6_K -> (576 % 256) Q8_0, as in the real file
        let p = plan(Ftype::Q4_1, 30, 3, true, 576);
        assert_eq!(ty(&p, "token_embd.weight"), T::Q8_0);
        assert_eq!(ty(&p, "blk.0.attn_q.weight"), T::Q4_1);
        // K types on 576-wide rows fall back
        let p = plan(Ftype::Q4_K_M, 30, 3, true, 576);
        assert_eq!(ty(&p, "blk.1.attn_q.weight"), T::Q5_0);
        assert_eq!(ty(&p, "blk.0.attn_v.weight"), T::Q8_0);
        assert_eq!(ty(&p, "token_embd.weight"), T::Q8_0);
        let p = plan(Ftype::Q2_K, 4, 1, false, 64);
        assert_eq!(ty(&p, "blk.0.attn_q.weight"), T::Q4_0);
        assert_eq!(fallback(T::Q4_0, 40), T::F16);
    }

    #[test]
    fn other_mixes() {
        let p = plan(Ftype::Q3_K_M, 32, 8, false, 4096);
        assert_eq!(ty(&p, "blk.1.attn_v.weight"), T::Q5_K);
        assert_eq!(ty(&p, "blk.2.attn_v.weight"), T::Q4_K);
        assert_eq!(ty(&p, "blk.1.ffn_down.weight"), T::Q5_K);
        assert_eq!(ty(&p, "blk.2.ffn_down.weight"), T::Q4_K);
        assert_eq!(ty(&p, "blk.2.attn_output.weight"), T::Q4_K);
        assert_eq!(ty(&p, "blk.2.ffn_up.weight"), T::Q3_K);
        let p = plan(Ftype::Q2_K, 32, 1, false, 4096);
        assert_eq!(ty(&p, "blk.9.attn_v.weight"), T::Q3_K);
        assert_eq!(ty(&p, "blk.9.ffn_up.weight"), T::Q2_K);
        let p = plan(Ftype::Q8_0, 2, 1, true, 4096);
        assert_eq!(ty(&p, "token_embd.weight"), T::Q8_0);
        let p = plan(Ftype::F16, 2, 1, false, 100);
        assert_eq!(ty(&p, "output.weight"), T::F16);
        assert_eq!(ty(&p, "blk.0.ffn_norm.weight"), T::F32);
        assert_eq!(Ftype::from_name("Q4_K_M"), Some(Ftype::Q4_K_M));
        assert_eq!(Ftype::from_name("q4_k"), Some(Ftype::Q4_K_M));
        assert_eq!(Ftype::Q4_K_M.llama_ftype(), 15);
        assert_eq!(Ftype::BF16.llama_ftype(), 32);
    }
}
