//! `QuantizePlan`: every tensor of an input model with the type it will have, the output's
//! metadata and sizes, checked before anything is written.

use super::mix::{Choice, MixOverrides, MixParams, MixPlanner};
use super::QuantizeError;
use crate::Ftype;
use quarrel_gguf::{Gguf, TensorInfo, Value};
use quarrel_quant::QuantType;

/// ggml's `GGML_QNT_VERSION`, written as `general.quantization_version`.
pub const QUANTIZATION_VERSION: u32 = 2;

/// llama-quantize's options that change the plan.
#[derive(Clone, Copy, Debug, Default)]
pub struct QuantizeOptions {
    /// Convert tensors that are already quantized (otherwise such a tensor is an error).
    pub allow_requantize: bool,
    /// `output.weight` keeps its type.
    pub leave_output_tensor: bool,
    pub output_tensor_type: Option<QuantType>,
    pub token_embedding_type: Option<QuantType>,
}

/// One tensor of the output.
#[derive(Clone, Debug)]
pub struct TensorPlan {
    /// The input tensor (name, shape, type, where its data are).
    pub info: TensorInfo,
    /// Its type in the output.
    pub to: QuantType,
    /// Data bytes in the output.
    pub out_bytes: u64,
    /// The mix's type when it did not fit the rows and `to` is llama.cpp's fallback.
    pub fallback_from: Option<QuantType>,
}

impl TensorPlan {
    /// Whether the data are converted (otherwise copied as they are).
    pub fn converts(&self) -> bool {
        self.info.ty != self.to
    }

    /// Whether an already quantized tensor is converted.
    pub fn requantizes(&self) -> bool {
        self.converts() && self.info.ty.is_quantized()
    }

    /// Elements per row and number of rows (experts' matrices count as more rows).
    pub fn rows(&self) -> (usize, usize) {
        let ne0 = self.info.dims[0].max(1);
        (ne0 as usize, (self.info.n_elements() / ne0) as usize)
    }
}

/// What `write_quantized` will write.
#[derive(Clone, Debug)]
pub struct QuantizePlan {
    pub ftype: Ftype,
    /// In input order (the output keeps it).
    pub tensors: Vec<TensorPlan>,
    /// The output's metadata: the input's, `general.file_type` and
    /// `general.quantization_version` set, a split model's `split.*` keys removed.
    pub metadata: Vec<(String, Value)>,
    /// Tensor data bytes of the input and of the output.
    pub in_bytes: u64,
    pub out_bytes: u64,
}

/// `key` as a number, or the first element of a per-layer array.
fn first_u64(g: &Gguf, key: &str) -> Result<Option<u64>, QuantizeError> {
    Ok(match g.get(key) {
        None => None,
        Some(Value::Array(_, items)) => items.first().and_then(Value::as_u64),
        Some(_) => g.get_u64(key)?,
    })
}

/// What the mix depends on, from the model's metadata and tensor names (as llama-quantize
/// reads them from the loaded model).
pub fn mix_params(g: &Gguf) -> Result<MixParams, QuantizeError> {
    let arch = g.architecture()?;
    let k = |s: &str| format!("{arch}.{s}");
    let n_layer = g.get_u64(&k("block_count"))?.unwrap_or(0) as usize;
    let n_head = first_u64(g, &k("attention.head_count"))?.unwrap_or(0);
    let n_head_kv = first_u64(g, &k("attention.head_count_kv"))?.unwrap_or(n_head);
    let n_gqa = n_head.checked_div(n_head_kv).unwrap_or(0) as usize;
    let n_expert = g.get_u64(&k("expert_count"))?.unwrap_or(0) as usize;
    let names = || g.tensors().iter().map(|t| t.name.as_str());
    let n_attn_v =
        names().filter(|n| n.contains("attn_v.weight") || n.contains("attn_qkv.weight") || n.contains("attn_kv_b.weight")).count();
    let tied_embeddings = !names().any(|n| n == "output.weight");
    let is_70b = n_layer == 80 && (arch == "qwen2" || (arch == "llama" && n_head != n_head_kv));
    Ok(MixParams { n_layer, n_gqa, n_expert, n_attn_v, tied_embeddings, is_70b })
}

/// Whether weights can be stored as `ty` (Q8_1 and Q8_K only hold activations: no matmul
/// takes them as weights).
pub fn is_weight_type(ty: QuantType) -> bool {
    quarrel_quant::kernels(ty).vec_dot.is_some()
}

fn check_weight_type(ty: Option<QuantType>) -> Result<(), QuantizeError> {
    match ty {
        Some(t) if !is_weight_type(t) => Err(QuantizeError::NotAWeightType(t)),
        _ => Ok(()),
    }
}

impl QuantizePlan {
    /// Plan `g` at `ftype`. Errors: what [`refusal`](Self::refusal) names, a requested type
    /// whose blocks do not divide a tensor's rows.
    pub fn new(g: &Gguf, ftype: Ftype, opts: &QuantizeOptions) -> Result<QuantizePlan, QuantizeError> {
        let plan = Self::unchecked(g, ftype, opts)?;
        match plan.refusal(opts) {
            Some(e) => Err(e),
            None => Ok(plan),
        }
    }

    /// The first thing llama-quantize refuses to do in this plan: convert an already
    /// quantized tensor without `allow_requantize`, or write Q2_K_S's Q2_K tensors, which
    /// need an importance matrix (Quarrel has none).
    pub fn refusal(&self, opts: &QuantizeOptions) -> Option<QuantizeError> {
        if let Some(t) = self.tensors.iter().find(|t| t.requantizes()).filter(|_| !opts.allow_requantize) {
            return Some(QuantizeError::Requantize { tensor: t.info.name.clone(), from: t.info.ty });
        }
        let needs_imatrix = |t: &&TensorPlan| {
            self.ftype == Ftype::Q2_K_S
                && t.to == QuantType::Q2_K
                && !matches!(t.info.name.as_str(), "token_embd.weight" | "per_layer_token_embd.weight" | "output.weight")
        };
        let t = self.tensors.iter().find(needs_imatrix)?;
        Some(QuantizeError::NeedsImatrix { tensor: t.info.name.clone(), ty: t.to })
    }

    /// The plan without [`refusal`](Self::refusal)'s checks (a dry run shows what would be
    /// refused).
    pub fn unchecked(g: &Gguf, ftype: Ftype, opts: &QuantizeOptions) -> Result<QuantizePlan, QuantizeError> {
        check_weight_type(opts.output_tensor_type)?;
        check_weight_type(opts.token_embedding_type)?;
        let overrides = MixOverrides {
            output: opts.output_tensor_type,
            token_embd: opts.token_embedding_type,
            quantize_output: !opts.leave_output_tensor,
        };
        let mut planner = MixPlanner::with_overrides(ftype, mix_params(g)?, overrides);
        let mut tensors = Vec::with_capacity(g.tensors().len());
        for info in g.tensors() {
            let choice = planner.next_choice(&info.name, &info.dims).unwrap_or(Choice { ty: info.ty, fallback_from: None });
            let to = choice.ty;
            let ne0 = info.dims[0].max(1);
            let row = usize::try_from(ne0)
                .ok()
                .and_then(|n| quarrel_quant::checked_row_bytes(to, n).ok())
                .ok_or_else(|| QuantizeError::RowLength { tensor: info.name.clone(), n: ne0, ty: to })?;
            let out_bytes = (info.n_elements() / ne0).checked_mul(row as u64).ok_or_else(|| QuantizeError::RowLength {
                tensor: info.name.clone(),
                n: ne0,
                ty: to,
            })?;
            tensors.push(TensorPlan { info: info.clone(), to, out_bytes, fallback_from: choice.fallback_from });
        }
        let mut metadata: Vec<(String, Value)> = g
            .metadata()
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "split.no" | "split.count" | "split.tensors.count"))
            .cloned()
            .collect();
        for (key, v) in [("general.quantization_version", QUANTIZATION_VERSION), ("general.file_type", ftype.llama_ftype())] {
            match metadata.iter_mut().find(|(k, _)| k == key) {
                Some(slot) => slot.1 = Value::U32(v),
                None => metadata.push((key.to_string(), Value::U32(v))),
            }
        }
        Ok(QuantizePlan {
            ftype,
            in_bytes: tensors.iter().map(|t| t.info.n_bytes).sum(),
            out_bytes: tensors.iter().map(|t| t.out_bytes).sum(),
            tensors,
            metadata,
        })
    }

    /// How many tensors get each output type, in order of first appearance.
    pub fn type_counts(&self) -> Vec<(QuantType, usize)> {
        let mut counts: Vec<(QuantType, usize)> = Vec::new();
        for t in &self.tensors {
            match counts.iter_mut().find(|(ty, _)| *ty == t.to) {
                Some(c) => c.1 += 1,
                None => counts.push((t.to, 1)),
            }
        }
        counts
    }
}
