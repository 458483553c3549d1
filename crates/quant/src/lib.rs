//! # quarrel-quant — GGML tensor formats, scalar reference kernels
//!
//! Bit-exact, dependency-light scalar implementations of the ggml/llama.cpp
//! element types Quarrel supports: one type table, reference dequantize
//! (bit-identical to gguf-py / ggml), reference quantize (ggml's
//! `quantize_row_*_ref`, bit-identical bytes) and scalar dot products
//! (ggml's `ggml_vec_dot_*_generic`, same float operation order). SIMD
//! kernels elsewhere test against these.
//!
//! ```text
//!  weight bytes (type W, from GGUF) ───────────────────┐
//!                                                      ▼
//!  f32 activations ──quantize(W.vec_dot_type())──▶ vec_dot(W, w, a, n) ──▶ f32
//!
//!  bytes of any type ──dequantize──▶ f32             (loading norms, tests, fallback)
//!  f32 ──quantize(W)──▶ bytes llama.cpp can load     (model synthesizer, KV cache)
//! ```
//!
//! | module        | responsibility                                                     |
//! |---------------|--------------------------------------------------------------------|
//! | `table`       | the single `quant_types!` table: ids, names, block/type sizes, dot partner |
//! | `layout`      | block byte layouts (`QK*`, `BLOCK_*_SIZE`, field offsets), LE field access |
//! | `float`       | F32/F16/BF16 conversions, rows and `vec_dot_f32/f16/bf16`          |
//! | `legacy`      | Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 (32-element blocks)             |
//! | `kquants`     | Q2_K..Q6_K, Q8_K (256-element super-blocks) + shared scale search  |
//! | `nonlinear`   | IQ4_NL, MXFP4 codebooks, E8M0 scales                               |
//! | `rotate`      | 32-point Walsh–Hadamard rotation (outlier spreading for quantized KV) |
//! | `scan`        | block statistics the reference quantizers share (signed absmax, min/max) |
//! | `lib` (here)  | `QuantError`, size validation, `dequantize`/`quantize`/`vec_dot` dispatch |
//!
//! Per-type kernels live in public modules re-exported at the root
//! (`quarrel_quant::q4_0::{dequantize_row, quantize_row, vec_dot_q8_0}`,
//! `q4_k::vec_dot_q8_k`, ...). They panic on inconsistent sizes; the
//! crate-level functions validate and return [`QuantError`] instead.

pub mod float;
pub mod kquants;
pub mod layout;
pub mod legacy;
pub mod nonlinear;
pub mod rotate;
mod scan;
mod table;

pub use float::{bf16_to_f32, f32_to_bf16, f32_to_fp16, fp16_to_f32};
pub use kquants::{q2_k, q3_k, q4_k, q5_k, q6_k, q8_k};
pub use layout::{QK4_0, QK4_1, QK4_NL, QK5_0, QK5_1, QK8_0, QK8_1, QK_K, QK_MXFP4};
pub use legacy::{q4_0, q4_1, q5_0, q5_1, q8_0, q8_1};
pub use nonlinear::{
    e8m0_to_fp32, e8m0_to_fp32_half, iq4_nl, mxfp4, E8M0_TO_FP32_BITS, E8M0_TO_FP32_HALF_BITS, KVALUES_IQ4NL, KVALUES_MXFP4,
};
pub use table::{QuantType, TypeInfo, TYPE_TABLE};

/// Errors of the crate-level (validating) API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// The element count is not a whole number of blocks.
    #[error("{ty}: {n} elements is not a multiple of the block size {block_size}")]
    NotBlockMultiple { ty: QuantType, n: usize, block_size: usize },
    /// A byte buffer has the wrong length for the element count.
    #[error("{ty}: {what} buffer is {got} bytes, but {n} elements need {expected} bytes")]
    BufferSize { ty: QuantType, what: &'static str, n: usize, expected: usize, got: usize },
    /// The byte size of the requested element count does not fit in `usize`.
    #[error("{ty}: byte size of {n} elements overflows usize")]
    Overflow { ty: QuantType, n: usize },
    /// The operation does not exist for this type (e.g. `vec_dot` with a
    /// Q8_1/Q8_K weight: ggml defines none for these activation-only types).
    #[error("{op} is not supported for {ty}")]
    Unsupported { ty: QuantType, op: &'static str },
}

/// Row dequantizer: `(src bytes, dst elements)`.
pub type DequantizeRowFn = fn(&[u8], &mut [f32]);
/// Row quantizer: `(src elements, dst bytes)`.
pub type QuantizeRowFn = fn(&[f32], &mut [u8]);
/// Dot product: `(n elements, weight bytes, activation bytes in vec_dot_type)`.
pub type VecDotFn = fn(usize, &[u8], &[u8]) -> f32;

/// The scalar reference kernels of one type (unchecked: they panic on bad sizes).
#[derive(Clone, Copy, Debug)]
pub struct Kernels {
    pub dequantize_row: DequantizeRowFn,
    pub quantize_row: QuantizeRowFn,
    /// `None` where ggml has no dot product (Q8_1, Q8_K).
    pub vec_dot: Option<VecDotFn>,
}

/// The reference kernels for `ty`.
pub fn kernels(ty: QuantType) -> Kernels {
    use QuantType::*;
    // One row per type: a block module's `dequantize_row` / `quantize_row` and its dot
    // product (if any); the float formats name theirs with a suffix.
    macro_rules! k {
        ($m:ident, $dot:ident) => {
            k!($m::dequantize_row, $m::quantize_row, Some($m::$dot))
        };
        ($m:ident) => {
            k!($m::dequantize_row, $m::quantize_row, None)
        };
        ($de:path, $qu:path, $dot:expr) => {
            Kernels { dequantize_row: $de, quantize_row: $qu, vec_dot: $dot }
        };
    }
    match ty {
        F32 => k!(float::dequantize_row_f32, float::quantize_row_f32, Some(float::vec_dot_f32)),
        F16 => k!(float::dequantize_row_f16, float::quantize_row_f16, Some(float::vec_dot_f16)),
        BF16 => k!(float::dequantize_row_bf16, float::quantize_row_bf16, Some(float::vec_dot_bf16)),
        Q4_0 => k!(q4_0, vec_dot_q8_0),
        Q4_1 => k!(q4_1, vec_dot_q8_1),
        Q5_0 => k!(q5_0, vec_dot_q8_0),
        Q5_1 => k!(q5_1, vec_dot_q8_1),
        Q8_0 => k!(q8_0, vec_dot_q8_0),
        Q8_1 => k!(q8_1),
        Q2_K => k!(q2_k, vec_dot_q8_k),
        Q3_K => k!(q3_k, vec_dot_q8_k),
        Q4_K => k!(q4_k, vec_dot_q8_k),
        Q5_K => k!(q5_k, vec_dot_q8_k),
        Q6_K => k!(q6_k, vec_dot_q8_k),
        Q8_K => k!(q8_k),
        IQ4_NL => k!(iq4_nl, vec_dot_q8_0),
        MXFP4 => k!(mxfp4, vec_dot_q8_0),
    }
}

/// Bytes needed for `n` elements of `ty`, or the matching error.
pub fn checked_row_bytes(ty: QuantType, n: usize) -> Result<usize, QuantError> {
    let block_size = ty.block_size();
    if !n.is_multiple_of(block_size) {
        return Err(QuantError::NotBlockMultiple { ty, n, block_size });
    }
    ty.row_bytes(n).ok_or(QuantError::Overflow { ty, n })
}

fn check_bytes(ty: QuantType, what: &'static str, n: usize, got: usize) -> Result<(), QuantError> {
    let expected = checked_row_bytes(ty, n)?;
    if got != expected {
        return Err(QuantError::BufferSize { ty, what, n, expected, got });
    }
    Ok(())
}

/// Dequantize `dst.len()` elements of type `ty` from `src`
/// (`src.len()` must be exactly `ty.row_bytes(dst.len())`).
pub fn dequantize(ty: QuantType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    check_bytes(ty, "source", dst.len(), src.len())?;
    (kernels(ty).dequantize_row)(src, dst);
    Ok(())
}

/// Quantize `src.len()` elements to type `ty` into `dst`
/// (`dst.len()` must be exactly `ty.row_bytes(src.len())`), with ggml's
/// reference algorithm for the type (bit-identical to `quantize_row_*_ref`).
pub fn quantize(ty: QuantType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    check_bytes(ty, "destination", src.len(), dst.len())?;
    (kernels(ty).quantize_row)(src, dst);
    Ok(())
}

/// Dot product of `n` elements: `w` in type `wty`, `a` in `wty.vec_dot_type()`.
pub fn vec_dot(wty: QuantType, w: &[u8], a: &[u8], n: usize) -> Result<f32, QuantError> {
    let dot = kernels(wty).vec_dot.ok_or(QuantError::Unsupported { ty: wty, op: "vec_dot" })?;
    check_bytes(wty, "weight", n, w.len())?;
    check_bytes(wty.vec_dot_type(), "activation", n, a.len())?;
    Ok(dot(n, w, a))
}

/// Convenience: quantize into a new `Vec`.
pub fn quantize_to_vec(ty: QuantType, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    let mut out = vec![0u8; checked_row_bytes(ty, src.len())?];
    quantize(ty, src, &mut out)?;
    Ok(out)
}

/// Convenience: dequantize `n` elements into a new `Vec`.
pub fn dequantize_to_vec(ty: QuantType, src: &[u8], n: usize) -> Result<Vec<f32>, QuantError> {
    check_bytes(ty, "source", n, src.len())?;
    let mut out = vec![0f32; n];
    dequantize(ty, src, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_reported() {
        let mut out = [0f32; 31];
        assert!(matches!(dequantize(QuantType::Q4_0, &[0; 18], &mut out), Err(QuantError::NotBlockMultiple { .. })));
        let mut out = [0f32; 32];
        let e = dequantize(QuantType::Q4_0, &[0; 17], &mut out).unwrap_err();
        assert_eq!(e, QuantError::BufferSize { ty: QuantType::Q4_0, what: "source", n: 32, expected: 18, got: 17 });
        assert_eq!(e.to_string(), "q4_0: source buffer is 17 bytes, but 32 elements need 18 bytes");
        assert!(matches!(vec_dot(QuantType::Q8_K, &[], &[], 0), Err(QuantError::Unsupported { .. })));
    }
}
