//! # quarrel-gguf: GGUF files, read zero-copy and written (tests, `quarrel synth`, `quarrel quantize`)
//!
//! ```text
//!  file on disk ──mmap──► parse::parse_header ──► Gguf { metadata, tensors, data: &[u8] }
//!                                                        │ tensor_data(name) -> &[u8] (no copy)
//!  GgufWriter { kv, tensor infos } ──► header ──► tensor bytes in order, padded ──► file
//! ```
//!
//! | module   | responsibility |
//! |----------|----------------|
//! | `value`  | metadata value types (every GGUF type incl. nested arrays) and typed getters |
//! | `parse`  | bounds-checked header / metadata / tensor-info parser with clear errors |
//! | `file`   | `Gguf`: owns the mmaps (or a buffer), looks up metadata and tensor views |
//! | `split`  | models split over several files (`split.*` keys, llama.cpp's file names) |
//! | `writer` | `GgufWriter`: writes v3 files llama.cpp loads, streaming tensor data |
//! | `error`  | `GgufError`: every way a file can be malformed, each naming what is wrong |
//!
//! Library code never panics on input: a malformed file is a `GgufError`.

mod error;
mod file;
mod parse;
mod split;
mod value;
mod writer;

pub use error::GgufError;
pub use file::{Gguf, TensorInfo};
pub use parse::MAX_ARRAY_ITEMS;
pub use quarrel_quant::QuantType;
pub use split::{split_path, write_split};
pub use value::{Value, ValueType};
pub use writer::{GgufWriter, TensorSink};

/// The file magic: "GGUF" in little-endian byte order.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's limit on tensor rank.
pub const MAX_DIMS: usize = 4;
