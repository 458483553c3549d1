//! Errors shared by backends, models and the engine.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CoreError {
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("shape mismatch: {0}")]
    Shape(String),
    #[error("model: {0}")]
    Model(String),
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    #[error("backend: {0}")]
    Backend(String),
    #[error(transparent)]
    Gguf(#[from] quarrel_gguf::GgufError),
    #[error(transparent)]
    Quant(#[from] quarrel_quant::QuantError),
}

pub type Result<T, E = CoreError> = std::result::Result<T, E>;
