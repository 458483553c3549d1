//! Shared building blocks; architectures choose their parameters.

pub mod attention;
pub mod mamba2;
pub mod mlp;
pub mod moe;
pub mod timing;

use quarrel_core::{Backend, CoreError, Result, WeightSource};
use quarrel_gguf::{Gguf, GgufWriter};
use std::sync::Arc;

/// Load a weight and check its shape `(n_in, n_out)`.
pub fn weight<B: Backend>(be: &B, g: &Arc<Gguf>, name: &str, n_in: usize, n_out: usize) -> Result<B::Weight> {
    let w = be.load_weight(WeightSource { gguf: g, name })?;
    let (i, o) = be.weight_dims(&w);
    if (i, o) != (n_in, n_out) {
        return Err(CoreError::Model(format!("tensor {name:?} has shape ({i}, {o}), expected ({n_in}, {n_out})")));
    }
    Ok(w)
}

/// Load a weight if the file has it.
pub fn opt_weight<B: Backend>(be: &B, g: &Arc<Gguf>, name: &str, n_in: usize, n_out: usize) -> Result<Option<B::Weight>> {
    if g.tensor_info(name).is_none() {
        return Ok(None);
    }
    weight(be, g, name, n_in, n_out).map(Some)
}

/// A small tensor (norm, bias, per-head vector) of `len` values, dequantized on the host.
pub fn host_f32(g: &Gguf, name: &str, len: usize) -> Result<Vec<f32>> {
    let info = g.tensor_info(name).ok_or_else(|| CoreError::Gguf(quarrel_gguf::GgufError::MissingTensor(name.to_string())))?;
    if info.n_elements() as usize != len {
        return Err(CoreError::Model(format!("tensor {name:?} has {} values, expected {len}", info.n_elements())));
    }
    let mut v = vec![0f32; len];
    quarrel_quant::dequantize(info.ty, g.tensor_bytes(info), &mut v)?;
    Ok(v)
}

/// Load a 3-D expert tensor `(n_in, n_out, n_expert)` (used in place) and check its shape.
pub fn expert_weight<B: Backend>(be: &B, g: &Arc<Gguf>, name: &str, n_in: usize, n_out: usize, n_expert: usize) -> Result<B::Weight> {
    let info = g.tensor_info(name).ok_or_else(|| CoreError::Gguf(quarrel_gguf::GgufError::MissingTensor(name.to_string())))?;
    let want = [n_in as u64, n_out as u64, n_expert as u64];
    if info.dims != want {
        return Err(CoreError::Model(format!("tensor {name:?} has dims {:?}, expected {want:?}", info.dims)));
    }
    weight(be, g, name, n_in, n_out * n_expert)
}

/// The 2-D tensor `name` of `g` cut into consecutive groups of output rows, each a tensor of
/// its own (`parts`: name and row count, in order) in an in-memory file. Fused projections
/// (`attn_qkv`, Phi-3's gate-and-up `ffn_up`) become the separate weights every backend's
/// fast paths take; the file's fused tensor is then never read again.
pub fn split_rows(g: &Gguf, name: &str, parts: &[(String, usize)]) -> Result<Arc<Gguf>> {
    let info = g.tensor_info(name).ok_or_else(|| CoreError::Gguf(quarrel_gguf::GgufError::MissingTensor(name.to_string())))?;
    let want: usize = parts.iter().map(|p| p.1).sum();
    if info.dims.len() != 2 || info.dims[1] as usize != want {
        return Err(CoreError::Model(format!("tensor {name:?} has dims {:?}, expected {want} rows", info.dims)));
    }
    let bytes = g.tensor_bytes(info);
    let row_bytes = bytes.len() / want.max(1);
    let mut w = GgufWriter::new();
    let mut data = Vec::with_capacity(parts.len());
    let mut row = 0;
    for (part, rows) in parts {
        w.add_tensor(part, &[info.dims[0], *rows as u64], info.ty)?;
        data.push(&bytes[row * row_bytes..(row + rows) * row_bytes]);
        row += rows;
    }
    Ok(Arc::new(Gguf::from_bytes(w.to_bytes(&data)?)?))
}
