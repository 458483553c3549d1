//! `CudaKv`: the paged KV cache in device memory, per layer `[slots][n_kv_head * head_dim]`
//! in the spec's element type (f32, f16, or ggml Q8_0 / Q4_0 blocks of each head Hadamard-rotated
//! in blocks of up to 256 values, as the CPU cache stores them, keys less the layer's key
//! offset first), zeroed at allocation.

use crate::error::CudaError;
use crate::fusion::Device;
use crate::runtime::DevMem;
use quarrel_core::{KvSpec, KvType};

pub struct CudaKv {
    pub spec: KvSpec,
    pub(crate) k: Vec<DevMem>,
    pub(crate) v: Vec<DevMem>,
    /// Quantized caches: each layer's per-channel key offset (`n_kv_head * head_dim` f32,
    /// not rotated), set by the layer's first store to the mean of that store's keys (the
    /// CPU cache's `KeyOffset`): subtracted before rotation + quantization, added back on read.
    pub(crate) k_off: Vec<Option<DevMem>>,
    /// Recurrent (Mamba2) state, when the model declares some (`alloc_state`).
    pub(crate) state: Option<crate::ssm::CudaState>,
}

/// The kernel-name suffix of a KV element type.
pub(crate) fn kv_name(t: KvType) -> &'static str {
    match t {
        KvType::F32 => "f32",
        KvType::F16 => "f16",
        KvType::Q8_0 => "q8_0",
        KvType::Q4_0 => "q4_0",
    }
}

impl CudaKv {
    pub(crate) fn new(dev: &Device, spec: &KvSpec) -> Result<CudaKv, CudaError> {
        let row = spec.n_kv_head * spec.head_dim;
        if matches!(spec.ty, KvType::Q8_0 | KvType::Q4_0) && !spec.head_dim.is_multiple_of(32) {
            return Err(CudaError::Unsupported(format!(
                "{} KV cache needs a head dimension that is a multiple of 32, not {}",
                spec.ty.name(),
                spec.head_dim
            )));
        }
        let slots = spec.n_blocks.checked_mul(spec.block_size).ok_or_else(|| CudaError::OutOfMemory("KV cache size overflows".into()))?;
        let bytes = slots
            .checked_mul(row)
            .and_then(|n| spec.ty.row_bytes(n))
            .ok_or_else(|| CudaError::OutOfMemory("KV cache size overflows".into()))?;
        let mut k = Vec::with_capacity(spec.n_layer);
        let mut v = Vec::with_capacity(spec.n_layer);
        for _ in 0..spec.n_layer {
            for dst in [&mut k, &mut v] {
                let m = DevMem::alloc(dev, bytes)?;
                dev.memset0(m.ptr, bytes)?;
                dst.push(m);
            }
        }
        Ok(CudaKv { spec: spec.clone(), k, v, k_off: (0..spec.n_layer).map(|_| None).collect(), state: None })
    }
}
