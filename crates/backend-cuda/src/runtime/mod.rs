//! The CUDA runtime the ops run on: context and stream, device memory and the buffer pool,
//! kernel compilation (NVRTC, disk cache), the launch queue with CUDA graphs and programmatic
//! dependent launch. It names no op: the kernels come from `crate::kernels`, and the launch held
//! back for fusion is whatever `Deferred` value the crate's fusion step stores.
//!
//! | module   | responsibility |
//! |----------|----------------|
//! | `device` | context, stream, kernel lookup, launches, the held launch, profiling report |
//! | `memory` | `DevMem` (raw allocation), `Pool` / `PoolMem` (deterministic buffer reuse) |
//! | `nvrtc`  | the kernel units, compiled in parallel to CUBIN (PTX fallback), cached on disk |
//! | `queue`  | launch queue: segments submitted early, repeating segments replayed as CUDA graphs |

mod device;
mod memory;
pub(crate) mod nvrtc;
mod queue;

pub use device::{available, device_count, Arg, Deferred, Device, Kernel};
pub use memory::{DevMem, PoolMem};
