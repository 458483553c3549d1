//! Shared building blocks; architectures choose their parameters.

pub mod attention;
pub mod mlp;

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
