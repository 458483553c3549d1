//! Converting a GGUF model to another file type, as llama.cpp's `llama-quantize` does
//! (`quarrel quantize`; `quarrel synth` types its tensors with the same mix).
//!
//! ```text
//!  Gguf (any tensor types) ──QuantizePlan::new(ftype, options)──► per tensor: the mix's type
//!       (mix: llama-quantize's rules and shape fallbacks), metadata with the new file type
//!  ──write_quantized──► header ─► per tensor, per chunk of rows (rayon):
//!       dequantize ─► f32 ─► quantize ─► file        (a tensor that keeps its type: copied)
//! ```
//!
//! | module    | responsibility |
//! |-----------|----------------|
//! | `mix`     | `MixPlanner`: the type of each tensor for a file type; `fallback` for rows a block does not divide |
//! | `plan`    | `QuantizePlan`: every tensor's input and output type and size, the output's metadata; the requantize check |
//! | `convert` | `write_quantized`: streams the output file; `check_distinct` (input != output) |

mod convert;
mod mix;
mod plan;

pub use convert::{check_distinct, write_quantized, Progress, QuantizeSummary, CHUNK_BYTES};
pub use mix::{allows_quantization, fallback, Choice, MixOverrides, MixParams, MixPlanner};
pub use plan::{is_weight_type, mix_params, QuantizeOptions, QuantizePlan, TensorPlan, QUANTIZATION_VERSION};

use quarrel_quant::QuantType;
use std::path::PathBuf;

/// Every way a conversion can fail.
#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    #[error(transparent)]
    Gguf(#[from] quarrel_gguf::GgufError),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// A quantized tensor would be converted without `allow_requantize`.
    #[error("requantizing from type {from} is disabled (tensor {tensor})")]
    Requantize { tensor: String, from: QuantType },
    #[error("this quantization requires an importance matrix (tensor {tensor}, type {ty}), which Quarrel cannot compute")]
    NeedsImatrix { tensor: String, ty: QuantType },
    /// A requested type's blocks do not divide a tensor's rows.
    #[error("{tensor}: rows of {n} elements cannot be stored as {ty} (blocks of {})", ty.block_size())]
    RowLength { tensor: String, n: u64, ty: QuantType },
    #[error("{0} is not a type weights can be stored in")]
    NotAWeightType(QuantType),
    #[error("input and output files are the same: '{}'", .0.display())]
    SameFile(PathBuf),
    #[error("converting {tensor}: {source}")]
    Quant { tensor: String, source: quarrel_quant::QuantError },
}
