//! `CpuWeight`: a zero-copy view of a GGUF tensor.

use quarrel_core::{CoreError, QuantType, Result, WeightSource};
use quarrel_gguf::Gguf;
use std::sync::Arc;

pub struct CpuWeight {
    pub ty: QuantType,
    /// Row length (input features).
    pub n_in: usize,
    /// Number of rows (output features; product of the outer dims).
    pub n_out: usize,
    gguf: Arc<Gguf>,
    index: usize,
    /// First row of this view within the tensor (nonzero for one expert of a 3-D tensor).
    row0: usize,
    /// f32 copy for 1-D weights (norms, biases): tiny and used on every token.
    f32_data: Option<Vec<f32>>,
    /// The rows interleaved for the repacked matmul (`simd::repack`), made on first use.
    packed: std::sync::OnceLock<Vec<u8>>,
}

impl CpuWeight {
    pub fn load(src: WeightSource<'_>) -> Result<CpuWeight> {
        let g = src.gguf;
        let index = g
            .tensors()
            .iter()
            .position(|t| t.name == src.name)
            .ok_or_else(|| CoreError::Gguf(quarrel_gguf::GgufError::MissingTensor(src.name.to_string())))?;
        let info = &g.tensors()[index];
        let n_in = info.dims[0] as usize;
        let n_out = (info.n_elements() / info.dims[0].max(1)) as usize;
        let f32_data = if info.dims.len() == 1 {
            let mut v = vec![0f32; n_in];
            quarrel_quant::dequantize(info.ty, g.tensor_bytes(info), &mut v)?;
            Some(v)
        } else {
            None
        };
        Ok(CpuWeight { ty: info.ty, n_in, n_out, gguf: Arc::clone(g), index, row0: 0, f32_data, packed: Default::default() })
    }

    /// The raw bytes of this weight's rows (borrowed from the mmap).
    pub fn bytes(&self) -> &[u8] {
        let all = self.gguf.tensor_bytes(&self.gguf.tensors()[self.index]);
        let rb = self.row_bytes();
        &all[self.row0 * rb..(self.row0 + self.n_out) * rb]
    }

    /// Expert `e` of a weight holding `n_expert` stacked matrices (a 3-D GGUF tensor
    /// `(n_in, n_out, n_expert)`): a zero-copy view of its `n_out / n_expert` rows.
    pub fn expert(&self, e: usize, n_expert: usize) -> Result<CpuWeight> {
        if n_expert == 0 || self.n_out % n_expert != 0 || e >= n_expert {
            return Err(CoreError::Shape(format!("expert {e} of {n_expert} in a weight of {} rows", self.n_out)));
        }
        let n = self.n_out / n_expert;
        Ok(CpuWeight {
            ty: self.ty,
            n_in: self.n_in,
            n_out: n,
            gguf: Arc::clone(&self.gguf),
            index: self.index,
            row0: self.row0 + e * n,
            f32_data: None,
            packed: Default::default(),
        })
    }

    /// This weight's rows repacked for `ty`'s interleaved kernels (`simd::repack`), made on
    /// the first call (the matmul then reads only this copy, never the mmapped rows).
    pub(crate) fn packed(&self, ty: crate::simd::repack::RepackTy) -> &[u8] {
        self.packed.get_or_init(|| crate::simd::repack::repack(ty, self.n_in, self.n_out, self.bytes()))
    }

    pub fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.n_in).expect("validated at load")
    }

    /// One row's bytes.
    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.bytes()[r * rb..(r + 1) * rb]
    }

    /// The f32 values of a 1-D weight.
    pub fn as_f32(&self) -> Result<&[f32]> {
        self.f32_data
            .as_deref()
            .ok_or_else(|| CoreError::Shape(format!("weight of shape ({}, {}) used as a vector", self.n_in, self.n_out)))
    }
}
