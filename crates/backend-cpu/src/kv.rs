//! `CpuKv`: paged K/V storage, per layer `[n_blocks * block_size slots][n_kv_head][head_dim]`.

use half::f16;
use half::slice::HalfFloatSliceExt;
use crate::simd::attn::KvRows;
use quarrel_core::{CoreError, ForwardBatch, KvSpec, KvType, QuantType, Result};
use quarrel_quant::rotate::{hadamard, hadamard_blocks, rotation_size, ROT_MAX};

pub(crate) enum Store {
    F32(Vec<f32>),
    F16(Vec<f16>),
    /// Q8_0 / Q4_0 blocks of 32 values, each Hadamard-rotated before quantization (outlier
    /// channels would otherwise eat a 4-bit block's scale); element offset `e` (a multiple of
    /// 32) starts at byte `e / 32 * type_size`.
    /// The third field is the rotation size (the largest power of two dividing head_dim).
    Quant(QuantType, Vec<u8>, usize),
}

impl Store {
    fn new(ty: KvType, n: usize, head_dim: usize) -> Result<Store> {
        Ok(match ty {
            KvType::F32 => Store::F32(vec![0.0; n]),
            KvType::F16 => Store::F16(vec![f16::ZERO; n]),
            KvType::Q8_0 | KvType::Q4_0 => {
                let qt = ty.quant_type();
                let bytes = qt.row_bytes(n).ok_or_else(|| CoreError::Shape(format!("{} KV cache of {n} values", ty.name())))?;
                let r = rotation_size(head_dim)
                    .ok_or_else(|| CoreError::Unsupported(format!("{} KV cache with head_dim {head_dim}", ty.name())))?;
                Store::Quant(qt, vec![0; bytes], r)
            }
        })
    }

    fn write(&mut self, at: usize, src: &[f32]) -> Result<()> {
        match self {
            Store::F32(v) => v[at..at + src.len()].copy_from_slice(src),
            Store::F16(v) => v[at..at + src.len()].convert_from_f32_slice(src),
            Store::Quant(qt, bytes, r) => {
                // each head's values are stored Hadamard-rotated in blocks of r (see
                // quarrel_quant::rotate); `at` and the length are multiples of head_dim
                let (bs, ts, r) = (qt.block_size(), qt.type_size(), *r);
                let dst = &mut bytes[at / bs * ts..(at + src.len()) / bs * ts];
                let mut b = [0f32; ROT_MAX];
                for (x, d) in src.chunks_exact(r).zip(dst.chunks_exact_mut(r / bs * ts)) {
                    let b = &mut b[..r];
                    b.copy_from_slice(x);
                    hadamard(b);
                    if *qt == QuantType::Q4_0 {
                        // 4 bits: pick each block's scale for the least error
                        quarrel_quant::q4_0::quantize_row_mse(b, d);
                    } else {
                        quarrel_quant::quantize(*qt, b, d)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The stored values when they are f32 or f16 (`None` for quantized stores, which
    /// attention reads through `dequantize`).
    pub(crate) fn rows(&self) -> Option<KvRows<'_>> {
        match self {
            Store::F32(v) => Some(KvRows::F32(v)),
            Store::F16(v) => Some(KvRows::F16(v)),
            Store::Quant(..) => None,
        }
    }

    /// Values `at..at + dst.len()` as f32 (`at` and the length multiples of the block).
    pub(crate) fn dequantize(&self, at: usize, dst: &mut [f32]) {
        match self {
            Store::F32(v) => dst.copy_from_slice(&v[at..at + dst.len()]),
            Store::F16(v) => v[at..at + dst.len()].convert_to_f32_slice(dst),
            Store::Quant(qt, bytes, r) => {
                let (bs, ts) = (qt.block_size(), qt.type_size());
                let src = &bytes[at / bs * ts..(at + dst.len()) / bs * ts];
                // sizes are multiples of the block by construction
                let _ = quarrel_quant::dequantize(*qt, src, dst);
                hadamard_blocks(dst, *r);
            }
        }
    }
}

pub struct CpuKv {
    pub spec: KvSpec,
    pub(crate) k: Vec<Store>,
    pub(crate) v: Vec<Store>,
    /// Recurrent (Mamba2) state, when the model has recurrent layers.
    pub state: Option<crate::ssm::CpuState>,
}

impl CpuKv {
    pub fn new(spec: &KvSpec) -> Result<CpuKv> {
        let per_layer = spec
            .n_blocks
            .checked_mul(spec.block_size)
            .and_then(|n| n.checked_mul(spec.n_kv_head * spec.head_dim))
            .ok_or_else(|| CoreError::OutOfMemory("KV cache size overflows".into()))?;
        if matches!(spec.ty, KvType::Q8_0 | KvType::Q4_0) && spec.head_dim % 32 != 0 {
            return Err(CoreError::Unsupported(format!(
                "{} KV cache needs a head dimension that is a multiple of 32, not {}",
                spec.ty.name(),
                spec.head_dim
            )));
        }
        let k = (0..spec.n_layer).map(|_| Store::new(spec.ty, per_layer, spec.head_dim)).collect::<Result<_>>()?;
        let v = (0..spec.n_layer).map(|_| Store::new(spec.ty, per_layer, spec.head_dim)).collect::<Result<_>>()?;
        Ok(CpuKv { spec: spec.clone(), k, v, state: None })
    }

    /// Element offset of a sequence position in a layer store.
    #[inline]
    pub(crate) fn slot_offset(&self, block_table: &[u32], pos: usize) -> usize {
        let bs = self.spec.block_size;
        let slot = block_table[pos / bs] as usize * bs + pos % bs;
        slot * self.spec.n_kv_head * self.spec.head_dim
    }

    pub(crate) fn store(&mut self, layer: usize, k: &[f32], v: &[f32], batch: &ForwardBatch) -> Result<()> {
        let row = self.spec.n_kv_head * self.spec.head_dim;
        if layer >= self.spec.n_layer {
            return Err(CoreError::Shape(format!("kv_store: layer {layer} of {}", self.spec.n_layer)));
        }
        if k.len() != batch.n_tokens() * row || v.len() != k.len() {
            return Err(CoreError::Shape(format!("kv_store: k/v have {}/{} values, expected {}", k.len(), v.len(), batch.n_tokens() * row)));
        }
        for s in &batch.seqs {
            for t in s.start..s.start + s.len {
                let pos = batch.positions[t] as usize;
                if pos / self.spec.block_size >= s.block_table.len()
                    || s.block_table[pos / self.spec.block_size] as usize >= self.spec.n_blocks
                {
                    return Err(CoreError::Shape(format!("kv_store: position {pos} has no valid block")));
                }
                let at = self.slot_offset(&s.block_table, pos);
                self.k[layer].write(at, &k[t * row..(t + 1) * row])?;
                self.v[layer].write(at, &v[t * row..(t + 1) * row])?;
            }
        }
        Ok(())
    }
}
