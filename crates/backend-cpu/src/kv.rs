//! `CpuKv`: paged K/V storage, per layer `[n_blocks][n_kv_head][block_size slots][head_dim]`:
//! within a block each KV head's positions are contiguous, so attention (a task per KV head)
//! streams whole cache lines instead of picking one head's row out of every slot.
//!
//! Quantized caches (Q8_0 / Q4_0) store every head Hadamard-rotated in power-of-two blocks
//! (see `quarrel_quant::rotate`). Quantized *key* caches also take out a per-layer,
//! per-channel key offset first: keys carry large per-channel offsets that are nearly the same
//! for every token, and a 4-bit block spends its scale on them. The offset is the mean key of
//! the layer's first store (the engine makes that a fixed calibration batch, so it is a
//! property of the model), kept in f32 and added back exactly when the keys are read:
//!
//! ```text
//!  write: k ─(− offset)─► H·(k − offset) ─► Q4_0/Q8_0 blocks
//!  read:  blocks ─► dequantize ─► (+ H·offset)  = H·k up to the quantization error
//!         (attention works in the rotated domain: q is rotated once, H·acc at the end)
//! ```

use crate::huge::HugeVec;
use crate::simd::attn::KvRows;
use half::f16;
use half::slice::HalfFloatSliceExt;
use quarrel_core::{CoreError, ForwardBatch, KvSpec, KvType, QuantType, Result};
use quarrel_quant::rotate::{hadamard, hadamard_blocks, rotation_size, ROT_MAX};

pub(crate) enum Store {
    F32(HugeVec<f32>),
    F16(HugeVec<f16>),
    /// Q8_0 / Q4_0 blocks of 32 values, each Hadamard-rotated before quantization (outlier
    /// channels would otherwise eat a 4-bit block's scale); element offset `e` (a multiple of
    /// 32) starts at byte `e / 32 * type_size`.
    /// The third field is the rotation size (the largest power of two dividing head_dim).
    Quant(QuantType, HugeVec<u8>, usize),
}

impl Store {
    fn new(ty: KvType, n: usize, head_dim: usize) -> Result<Store> {
        Ok(match ty {
            KvType::F32 => Store::F32(HugeVec::zeroed(&crate::huge::KV, n)),
            KvType::F16 => Store::F16(HugeVec::zeroed(&crate::huge::KV, n)),
            KvType::Q8_0 | KvType::Q4_0 => {
                let qt = ty.quant_type();
                let bytes = qt.row_bytes(n).ok_or_else(|| CoreError::Shape(format!("{} KV cache of {n} values", ty.name())))?;
                let r = rotation_size(head_dim)
                    .ok_or_else(|| CoreError::Unsupported(format!("{} KV cache with head_dim {head_dim}", ty.name())))?;
                Store::Quant(qt, HugeVec::zeroed(&crate::huge::KV, bytes), r)
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

    /// Values `at..at + dst.len()` as f32 in the rotated domain (`H·x` for each rotation
    /// block; quantized stores only, `at` and the length multiples of the rotation size).
    pub(crate) fn dequantize_rotated(&self, at: usize, dst: &mut [f32]) {
        if let Store::Quant(qt, bytes, _) = self {
            let (bs, ts) = (qt.block_size(), qt.type_size());
            let src = &bytes[at / bs * ts..(at + dst.len()) / bs * ts];
            // sizes are multiples of the block by construction
            let _ = quarrel_quant::dequantize(*qt, src, dst);
        }
    }

    /// The rotation size of a quantized store.
    pub(crate) fn rotation(&self) -> Option<usize> {
        match self {
            Store::Quant(_, _, r) => Some(*r),
            _ => None,
        }
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
}

pub struct CpuKv {
    pub spec: KvSpec,
    pub(crate) k: Vec<Store>,
    pub(crate) v: Vec<Store>,
    /// Quantized key caches: each layer's key offset, once its first store has set it.
    pub(crate) k_offset: Vec<Option<KeyOffset>>,
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
        if matches!(spec.ty, KvType::Q8_0 | KvType::Q4_0) && !spec.head_dim.is_multiple_of(32) {
            return Err(CoreError::Unsupported(format!(
                "{} KV cache needs a head dimension that is a multiple of 32, not {}",
                spec.ty.name(),
                spec.head_dim
            )));
        }
        let k = (0..spec.n_layer).map(|_| Store::new(spec.ty, per_layer, spec.head_dim)).collect::<Result<_>>()?;
        let v = (0..spec.n_layer).map(|_| Store::new(spec.ty, per_layer, spec.head_dim)).collect::<Result<_>>()?;
        Ok(CpuKv { spec: spec.clone(), k, v, k_offset: (0..spec.n_layer).map(|_| None).collect(), state: None })
    }

    /// Element offset of a sequence position's row for KV head `kvh` in a layer store; the
    /// positions of one cache block follow each other `head_dim` apart.
    #[inline]
    pub(crate) fn row_offset(&self, block_table: &[u32], pos: usize, kvh: usize) -> usize {
        let bs = self.spec.block_size;
        ((block_table[pos / bs] as usize * self.spec.n_kv_head + kvh) * bs + pos % bs) * self.spec.head_dim
    }

    /// [`CpuKv::store`], with the tokens' rows written in parallel on `be`'s pool where that
    /// pays (an f16 cache, many tokens, 2+ threads, every token's slot a distinct one).
    pub(crate) fn store_on(&mut self, be: &crate::CpuBackend, layer: usize, k: &[f32], v: &[f32], batch: &ForwardBatch) -> Result<()> {
        const PAR_MIN_TOKENS: usize = 8;
        let n = batch.n_tokens();
        let f16_both = layer < self.spec.n_layer && matches!((&self.k[layer], &self.v[layer]), (Store::F16(_), Store::F16(_)));
        if be.n_threads() < 2 || n < PAR_MIN_TOKENS || !f16_both {
            return self.store(layer, k, v, batch);
        }
        let (hd, nkv, bs) = (self.spec.head_dim, self.spec.n_kv_head, self.spec.block_size);
        let row = nkv * hd;
        if k.len() != n * row || v.len() != k.len() {
            return self.store(layer, k, v, batch); // its shape error
        }
        // each token's slot (block, position in block); all valid and distinct, else the
        // sequential path (which reports a bad position; two writers of one slot keep its order)
        let mut slots = Vec::with_capacity(n);
        for s in &batch.seqs {
            for t in s.start..s.start + s.len {
                let pos = *batch.positions.get(t).ok_or_else(|| CoreError::Shape(format!("kv_store: token {t} has no position")))? as usize;
                match s.block_table.get(pos / bs) {
                    Some(&b) if (b as usize) < self.spec.n_blocks => slots.push((t, self.row_offset(&s.block_table, pos, 0))),
                    _ => return self.store(layer, k, v, batch),
                }
            }
        }
        let mut sorted: Vec<usize> = slots.iter().map(|&(_, at)| at).collect();
        sorted.sort_unstable();
        if slots.len() != n || sorted.windows(2).any(|w| w[0] == w[1]) {
            return self.store(layer, k, v, batch);
        }
        let (Store::F16(kd), Store::F16(vd)) = (&mut self.k[layer], &mut self.v[layer]) else { unreachable!("checked above") };
        let (kp, vp, len) = (kd.as_mut_ptr() as usize, vd.as_mut_ptr() as usize, kd.len());
        be.for_each_task(slots.len(), &|i| {
            let (t, at0) = slots[i];
            for kvh in 0..nkv {
                // KV head kvh's row of this slot: `bs * hd` values after head kvh - 1's
                let at = at0 + kvh * bs * hd;
                debug_assert!(at + hd <= len);
                // SAFETY: the slots are distinct, so every task writes its own rows of the
                // caches (`hd` values at `at`, inside them: the block ids were checked), and
                // `kd` / `vd` outlive the tasks.
                let (kr, vr) = unsafe {
                    (
                        std::slice::from_raw_parts_mut((kp as *mut f16).add(at), hd),
                        std::slice::from_raw_parts_mut((vp as *mut f16).add(at), hd),
                    )
                };
                kr.convert_from_f32_slice(&k[t * row + kvh * hd..t * row + (kvh + 1) * hd]);
                vr.convert_from_f32_slice(&v[t * row + kvh * hd..t * row + (kvh + 1) * hd]);
            }
        });
        Ok(())
    }

    pub(crate) fn store(&mut self, layer: usize, k: &[f32], v: &[f32], batch: &ForwardBatch) -> Result<()> {
        let row = self.spec.n_kv_head * self.spec.head_dim;
        if layer >= self.spec.n_layer {
            return Err(CoreError::Shape(format!("kv_store: layer {layer} of {}", self.spec.n_layer)));
        }
        if k.len() != batch.n_tokens() * row || v.len() != k.len() {
            return Err(CoreError::Shape(format!(
                "kv_store: k/v have {}/{} values, expected {}",
                k.len(),
                v.len(),
                batch.n_tokens() * row
            )));
        }
        // quantized keys: offset taken out before quantization (set by the layer's first store)
        let mut shifted = Vec::new();
        let k = match self.k[layer].rotation() {
            Some(r) if batch.n_tokens() > 0 => {
                let off = self.k_offset[layer].get_or_insert_with(|| KeyOffset::mean_of(k, row, r));
                shifted.extend_from_slice(k);
                shifted.chunks_exact_mut(row).for_each(|x| x.iter_mut().zip(&off.m).for_each(|(a, b)| *a -= b));
                &shifted[..]
            }
            _ => k,
        };
        for s in &batch.seqs {
            for t in s.start..s.start + s.len {
                let pos = batch.positions[t] as usize;
                if pos / self.spec.block_size >= s.block_table.len()
                    || s.block_table[pos / self.spec.block_size] as usize >= self.spec.n_blocks
                {
                    return Err(CoreError::Shape(format!("kv_store: position {pos} has no valid block")));
                }
                let hd = self.spec.head_dim;
                for kvh in 0..self.spec.n_kv_head {
                    let at = self.row_offset(&s.block_table, pos, kvh);
                    let src = t * row + kvh * hd..t * row + (kvh + 1) * hd;
                    self.k[layer].write(at, &k[src.clone()])?;
                    self.v[layer].write(at, &v[src])?;
                }
            }
        }
        Ok(())
    }
}

/// A layer's per-channel key offset (`n_kv_head * head_dim` values): as is, and rotated the
/// way the cache rotates each head.
#[derive(Clone, Debug)]
pub(crate) struct KeyOffset {
    pub m: Vec<f32>,
    pub rotated: Vec<f32>,
}

impl KeyOffset {
    /// The mean of the rows (`row` values each) of `k`; `r` the store's rotation size.
    fn mean_of(k: &[f32], row: usize, r: usize) -> KeyOffset {
        let n = (k.len() / row).max(1);
        let mut sum = vec![0f64; row];
        for x in k.chunks_exact(row) {
            sum.iter_mut().zip(x).for_each(|(a, &b)| *a += b as f64);
        }
        let m: Vec<f32> = sum.iter().map(|s| (s / n as f64) as f32).collect();
        let mut rotated = m.clone();
        hadamard_blocks(&mut rotated, r);
        KeyOffset { m, rotated }
    }
}
