//! `CudaWeight`: a GGUF tensor uploaded once, repacked for 16-byte loads.
//!
//! | stored type | on the device |
//! |---|---|
//! | Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 | payload plane (16 B nibbles / 32 B int8 per 32 values) + meta plane (d [, m] [, qh]) |
//! | Q4_K Q5_K | ggml super-blocks as stored (144 / 176 B, multiples of 16) |
//! | Q6_K | super-blocks padded from 210 to 224 B |
//! | F32 F16 BF16 | as stored |
//! | 1-D tensors (norms) | f32 |
//! | MXFP4 | as Q8_0 (the codebook values as int8, the E8M0 scale as the f16 scale: the same values; twice the bytes) |
//! | other types (Q2_K, Q3_K, IQ4_NL, ...) | dequantized at load to f16 (no kernel of their own yet) |

pub mod experts;
pub mod unit;

use crate::error::CudaError;
use crate::fusion::Device;
use crate::runtime::DevMem;
use crate::weights::experts::{ExpertBudget, Offload};
use quarrel_core::{QuantType, WeightSource};

/// How the kernels read a weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevType {
    /// Quantized, read in units of 32 values; the name is the kernel suffix.
    Quant(&'static str),
    F32,
    F16,
    BF16,
}

impl DevType {
    pub fn name(self) -> &'static str {
        match self {
            DevType::Quant(n) => n,
            DevType::F32 => "f32",
            DevType::F16 => "f16",
            DevType::BF16 => "bf16",
        }
    }
}

pub struct CudaWeight {
    /// The type stored in the GGUF file.
    pub ty: QuantType,
    pub dev_ty: DevType,
    pub n_in: usize,
    pub n_out: usize,
    pub(crate) p: DevMem,
    pub(crate) m: Option<DevMem>,
    /// Weight bytes on the device (for bandwidth figures).
    pub bytes: usize,
    /// An f16 copy for the prefill GEMM, made on first use when memory allows.
    pub(crate) f16: std::sync::Mutex<Option<DevMem>>,
    /// Multiply with decode's numerics at every token count (MMQ for quantized weights, never
    /// the f16 GEMM): set for models with experts or recurrent layers (`exact_prefill`), whose
    /// discrete routing choices and carried state must see the same numbers in a prefill as
    /// token by token.
    pub exact: bool,
    /// A 3-D expert tensor beyond the expert budget: in host memory, hot experts cached on the
    /// device (`p`, `m` are then placeholders).
    pub(crate) offload: Option<crate::weights::experts::Offload>,
}

/// Whether `g`'s weights multiply with decode's numerics at every token count: the file has
/// experts (`{arch}.expert_count` > 0) or Mamba2 layers (`{arch}.ssm.state_size`): a long
/// prefill through the f16 tensor-core GEMM could make a near-tie in a router pick another
/// expert than token-by-token decode would.
pub fn exact_prefill(g: &quarrel_gguf::Gguf) -> bool {
    let Ok(arch) = g.architecture() else { return false };
    let experts = g.get_u64(&format!("{arch}.expert_count")).ok().flatten().unwrap_or(0) > 0;
    experts || g.get(&format!("{arch}.ssm.state_size")).is_some()
}

impl CudaWeight {
    pub fn m_ptr(&self) -> u64 {
        self.m.as_ref().map_or(0, |m| m.ptr)
    }

    /// Upload `src`; a 3-D expert tensor that does not fit `budget` (or device memory) stays
    /// in host memory (`experts::Offload`).
    pub(crate) fn load(dev: &Device, src: WeightSource<'_>, budget: &ExpertBudget) -> Result<CudaWeight, CudaError> {
        let g = src.gguf;
        let info = g.tensor_info(src.name).ok_or_else(|| CudaError::Shape(format!("tensor {} not found in the model", src.name)))?;
        let n_in = info.dims[0] as usize;
        let n_out = (info.n_elements() / info.dims[0].max(1)) as usize;
        let bytes = g.tensor_bytes(info);
        let ty = info.ty;
        let exact = exact_prefill(g);
        if info.dims.len() == 1 {
            let v = dequant(ty, bytes, n_in, src.name)?;
            return Self::plain(dev, ty, DevType::F32, n_in, n_out, &v, exact);
        }
        let repacked = if matches!(ty, QuantType::F32 | QuantType::F16 | QuantType::BF16) && !n_in.is_multiple_of(8) {
            None
        } else {
            repack(ty, bytes)
        };
        let Some((dev_ty, p, m)) = repacked else {
            if !n_in.is_multiple_of(8) {
                return Err(CudaError::Unsupported(format!("{}: rows of {n_in} values (the GPU kernels need a multiple of 8)", src.name)));
            }
            // no kernel for this type: f16 copy
            let v = dequant(ty, bytes, n_in * n_out, src.name)?;
            let h: Vec<u16> = v.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect();
            return Self::plain(dev, ty, DevType::F16, n_in, n_out, &h, exact);
        };
        let total = p.len() + m.as_ref().map_or(0, |m| m.len());
        let experts = info.dims.len() == 3 && matches!(dev_ty, DevType::Quant(_));
        if experts {
            let n_expert = info.dims[2] as usize;
            // fits the budget: resident, unless the device itself is full (then offloaded
            // without slots rather than failing the load)
            let (resident, slots_from) = if budget.take(total) {
                match (DevMem::upload(dev, &p), m.as_ref().map(|m| DevMem::upload(dev, m)).transpose()) {
                    (Ok(pd), Ok(md)) => (Some((pd, md)), None),
                    (Err(CudaError::OutOfMemory(_)), _) | (_, Err(CudaError::OutOfMemory(_))) => (None, None),
                    (Err(e), _) | (_, Err(e)) => return Err(e),
                }
            } else {
                (None, Some(budget))
            };
            if resident.is_none() {
                budget.mark_offloaded();
            }
            let (pd, md, off) = match resident {
                Some((pd, md)) => (pd, md, None),
                None => (DevMem::alloc(dev, 256)?, None, Some(Offload::new(dev, slots_from, &p, m.as_deref(), n_expert)?)),
            };
            let bytes = off.as_ref().map_or(total, |o| o.device_bytes());
            return Ok(CudaWeight { ty, dev_ty, n_in, n_out, p: pd, m: md, bytes, f16: Default::default(), exact, offload: off });
        }
        Ok(CudaWeight {
            ty,
            dev_ty,
            n_in,
            n_out,
            p: DevMem::upload(dev, &p)?,
            m: m.map(|m| DevMem::upload(dev, &m)).transpose()?,
            bytes: total,
            f16: Default::default(),
            exact,
            offload: None,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn plain<T: Copy>(
        dev: &Device,
        ty: QuantType,
        dev_ty: DevType,
        n_in: usize,
        n_out: usize,
        v: &[T],
        exact: bool,
    ) -> Result<CudaWeight, CudaError> {
        Ok(CudaWeight {
            ty,
            dev_ty,
            n_in,
            n_out,
            p: DevMem::upload(dev, v)?,
            m: None,
            bytes: std::mem::size_of_val(v),
            f16: Default::default(),
            exact,
            offload: None,
        })
    }
}

/// The device layout of a tensor's bytes (see the module table): kind, payload plane, meta
/// plane. `None` for types without a kernel.
pub fn repack(ty: QuantType, bytes: &[u8]) -> Option<(DevType, Vec<u8>, Option<Vec<u8>>)> {
    let ts = ty.type_size();
    Some(match ty {
        QuantType::Q4_0 => with(DevType::Quant("q4_0"), split(bytes, ts, &[(2, 16)], &[(0, 2)], 16, 2)),
        QuantType::Q4_1 => with(DevType::Quant("q4_1"), split(bytes, ts, &[(4, 16)], &[(0, 4)], 16, 4)),
        QuantType::Q5_0 => with(DevType::Quant("q5_0"), split(bytes, ts, &[(6, 16)], &[(0, 2), (2, 4)], 16, 8)),
        QuantType::Q5_1 => with(DevType::Quant("q5_1"), split(bytes, ts, &[(8, 16)], &[(0, 4), (4, 4)], 16, 8)),
        QuantType::Q8_0 => with(DevType::Quant("q8_0"), split(bytes, ts, &[(2, 32)], &[(0, 2)], 32, 2)),
        QuantType::MXFP4 => {
            let q8 = mxfp4_as_q8_0(bytes)?;
            with(DevType::Quant("q8_0"), split(&q8, QuantType::Q8_0.type_size(), &[(2, 32)], &[(0, 2)], 32, 2))
        }
        QuantType::Q4_K => (DevType::Quant("q4_K"), bytes.to_vec(), None),
        QuantType::Q5_K => (DevType::Quant("q5_K"), bytes.to_vec(), None),
        QuantType::Q6_K => {
            let mut p = vec![0u8; bytes.len() / ts * 224];
            for (b, o) in bytes.chunks_exact(ts).zip(p.chunks_exact_mut(224)) {
                o[..ts].copy_from_slice(b);
            }
            (DevType::Quant("q6_K"), p, None)
        }
        QuantType::F32 => (DevType::F32, bytes.to_vec(), None),
        QuantType::F16 => (DevType::F16, bytes.to_vec(), None),
        QuantType::BF16 => (DevType::BF16, bytes.to_vec(), None),
        _ => return None,
    })
}

/// MXFP4 blocks (`{u8 e; u8 qs[16]}`, value `2^(e-128) * KVALUES_MXFP4[nibble]`, low nibbles
/// the first 16 values) as Q8_0 blocks of the same values: the codebook entries as int8, the
/// scale as f16. None when a scale lies outside f16's range (then the weight takes the f16
/// path).
pub fn mxfp4_as_q8_0(bytes: &[u8]) -> Option<Vec<u8>> {
    use quarrel_quant::{e8m0_to_fp32_half, KVALUES_MXFP4};
    let (ts, qk) = (QuantType::MXFP4.type_size(), 32);
    if !bytes.len().is_multiple_of(ts) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / ts * QuantType::Q8_0.type_size());
    for b in bytes.chunks_exact(ts) {
        let d = e8m0_to_fp32_half(b[0]);
        let h = half::f16::from_f32(d);
        if h.to_f32() != d {
            return None;
        }
        out.extend(h.to_bits().to_le_bytes());
        let mut q = [0u8; 32];
        for (j, &byte) in b[1..].iter().enumerate() {
            q[j] = KVALUES_MXFP4[(byte & 0xF) as usize] as u8;
            q[j + qk / 2] = KVALUES_MXFP4[(byte >> 4) as usize] as u8;
        }
        out.extend(q);
    }
    Some(out)
}

fn with(t: DevType, (p, m): (Vec<u8>, Option<Vec<u8>>)) -> (DevType, Vec<u8>, Option<Vec<u8>>) {
    (t, p, m)
}

fn dequant(ty: QuantType, bytes: &[u8], n: usize, name: &str) -> Result<Vec<f32>, CudaError> {
    let mut v = vec![0f32; n];
    quarrel_quant::dequantize(ty, bytes, &mut v).map_err(|e| CudaError::Shape(format!("{name}: {e}")))?;
    Ok(v)
}

/// Split blocks of `ts` bytes into a payload plane (byte ranges `pay`, `pb` bytes per block)
/// and a meta plane (ranges `meta`, packed and padded to `mb` bytes per block).
fn split(bytes: &[u8], ts: usize, pay: &[(usize, usize)], meta: &[(usize, usize)], pb: usize, mb: usize) -> (Vec<u8>, Option<Vec<u8>>) {
    let n = bytes.len() / ts;
    let (mut p, mut m) = (Vec::with_capacity(n * pb), vec![0u8; n * mb]);
    for (b, mo) in bytes.chunks_exact(ts).zip(m.chunks_exact_mut(mb)) {
        for &(o, l) in pay {
            p.extend_from_slice(&b[o..o + l]);
        }
        let mut at = 0;
        for &(o, l) in meta {
            // Q5_0: d then qh at byte 4 (after 2 bytes of padding)
            if at == 2 && mb == 8 && l == 4 {
                at = 4;
            }
            mo[at..at + l].copy_from_slice(&b[o..o + l]);
            at += l;
        }
    }
    (p, Some(m))
}

#[cfg(test)]
mod tests {
    use super::mxfp4_as_q8_0;
    use proptest::prelude::*;
    use quarrel_core::QuantType;

    proptest! {
        /// The Q8_0 blocks hold MXFP4's values exactly (both dequantized by the reference
        /// decoders), for every scale f16 holds; scales beyond it are refused.
        #[test]
        fn mxfp4_as_q8_0_keeps_the_values(blocks in proptest::collection::vec((100u8..150, proptest::array::uniform16(any::<u8>())), 1..8)) {
            let bytes: Vec<u8> = blocks.iter().flat_map(|(e, qs)| std::iter::once(*e).chain(qs.iter().copied())).collect();
            let n = blocks.len() * 32;
            let mut want = vec![0f32; n];
            quarrel_quant::mxfp4::dequantize_row(&bytes, &mut want);
            let in_range = blocks.iter().all(|&(e, _)| (104..=143).contains(&e));
            match mxfp4_as_q8_0(&bytes) {
                Some(q8) => {
                    prop_assert!(in_range);
                    let mut got = vec![0f32; n];
                    quarrel_quant::dequantize(QuantType::Q8_0, &q8, &mut got).unwrap();
                    prop_assert_eq!(want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), got.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                }
                None => prop_assert!(!in_range),
            }
        }
    }
}
