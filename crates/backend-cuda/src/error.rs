//! Errors of the CUDA backend, mapped onto `CoreError` at the trait boundary.

use quarrel_core::CoreError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CudaError {
    #[error("CUDA unavailable: {0}")]
    NoDevice(String),
    #[error("CUDA out of memory: {0}")]
    OutOfMemory(String),
    #[error("CUDA driver: {0}")]
    Driver(String),
    #[error("NVRTC compile of the kernels failed: {0}")]
    Compile(String),
    #[error("cuBLAS: {0}")]
    Blas(String),
    #[error("shape: {0}")]
    Shape(String),
    #[error("unsupported on CUDA: {0}")]
    Unsupported(String),
}

impl From<CudaError> for CoreError {
    fn from(e: CudaError) -> CoreError {
        match e {
            CudaError::OutOfMemory(m) => CoreError::OutOfMemory(m),
            CudaError::Shape(m) => CoreError::Shape(m),
            CudaError::Unsupported(m) => CoreError::Unsupported(m),
            other => CoreError::Backend(other.to_string()),
        }
    }
}

/// `map_err` helper for driver calls: `.map_err(drv("what"))`.
pub fn drv(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> CudaError {
    move |e| CudaError::Driver(format!("{what}: {e:?}"))
}
