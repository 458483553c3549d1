//! Shared building blocks; architectures choose their parameters.

pub mod attention;
pub mod mamba2;
pub mod mlp;
pub mod moe;
pub mod timing;

use quarrel_core::{Backend, CoreError, Result, WeightSource};
use quarrel_gguf::Gguf;
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
