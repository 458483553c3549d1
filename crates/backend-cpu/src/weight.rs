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
    /// The whole tensor's rows interleaved for the repacked matmul (`simd::repack`), made on
    /// first use; shared with the expert views of a 3-D tensor.
    packed: Arc<std::sync::OnceLock<Kept>>,
    /// The rows as GEMM weight panels (`simd::Gemm::pack_weights`), made on first use.
    panels: std::sync::OnceLock<Kept>,
    /// A per-call view of one expert (`expert`): nothing is cached on it.
    view: bool,
}

/// 64 bytes, 64-byte aligned (panel storage).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Line64(pub [u8; 64]);

/// A kept copy of a weight (repacked rows or GEMM panels): streamed from memory on every
/// step, so on huge pages ([`crate::huge`]); 64-byte aligned either way.
enum Kept {
    Huge(crate::huge::Region),
    Lines(Vec<Line64>, usize),
}

impl Kept {
    /// `bytes` zero bytes, filled by `fill`.
    fn new(bytes: usize, fill: impl FnOnce(&mut [u8])) -> Kept {
        match crate::huge::WEIGHTS.alloc(bytes) {
            Some(mut r) => {
                fill(r.bytes_mut());
                Kept::Huge(r)
            }
            None => {
                let mut v = vec![Line64([0; 64]); bytes.div_ceil(64)];
                // SAFETY: `Line64` is 64 plain bytes without padding; the slice lies inside `v`.
                fill(unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, bytes) });
                Kept::Lines(v, bytes)
            }
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Kept::Huge(r) => r.bytes(),
            // SAFETY: as in `new`, read-only.
            Kept::Lines(v, n) => unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, *n) },
        }
    }
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
        Ok(CpuWeight {
            ty: info.ty,
            n_in,
            n_out,
            gguf: Arc::clone(g),
            index,
            row0: 0,
            f32_data,
            packed: Arc::default(),
            panels: Default::default(),
            view: false,
        })
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
        if n_expert == 0 || !self.n_out.is_multiple_of(n_expert) || e >= n_expert {
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
            packed: Arc::clone(&self.packed),
            panels: Default::default(),
            view: true,
        })
    }

    /// This weight's rows repacked for `ty`'s interleaved kernels (`simd::repack`): the
    /// whole tensor is repacked on the first call (groups in parallel on `be`'s pool) and kept;
    /// the matmul then reads only this copy, never the mmapped rows. None for an expert view
    /// whose rows do not start on a group boundary (it takes the vec_dot path).
    pub(crate) fn packed(&self, be: &crate::CpuBackend, ty: crate::simd::repack::RepackTy) -> Option<&[u8]> {
        use crate::simd::repack::{repack_into, R};
        if !self.row0.is_multiple_of(R) {
            return None;
        }
        let gb = ty.group_bytes(self.n_in);
        let all = self.packed.get_or_init(|| {
            let info = &self.gguf.tensors()[self.index];
            let (rb, src) = (self.row_bytes(), self.gguf.tensor_bytes(info));
            let total = src.len() / rb;
            let out = Kept::new(total.div_ceil(R) * gb, |out| {
                // 64 groups per task: a few hundred KB, a few tasks per thread on big matrices
                be.par_chunks_mut(out, 64 * gb, &|c, chunk| {
                    let r0 = c * 64 * R;
                    let n = (total - r0).min(64 * R);
                    repack_into(ty, self.n_in, n, &src[r0 * rb..(r0 + n) * rb], chunk);
                });
            });
            // the matmul reads only the repacked copy from now on
            release_pages(src);
            out
        });
        let g0 = self.row0 / R;
        Some(&all.bytes()[g0 * gb..(g0 + self.n_out.div_ceil(R)) * gb])
    }

    /// `f` on `bytes` bytes of GEMM panels filled by `fill`: on a weight, filled on the first
    /// call and kept (a weight has one GEMM kind, that of its type); on a view, made for
    /// this call only.
    pub(crate) fn with_gemm_panels<R>(&self, bytes: usize, fill: impl FnOnce(&mut [u8]), f: impl FnOnce(&[u8]) -> R) -> R {
        if let Some(v) = self.panels.get() {
            return f(v.bytes());
        }
        // kept panels are a second copy of the rows (decode reads the rows): bounded
        if self.view || !reserve_panel_bytes(bytes) {
            // per call: a plain allocation (the arena is for what is kept)
            let mut v = vec![Line64([0; 64]); bytes.div_ceil(64)];
            // SAFETY: `Line64` is 64 plain bytes without padding; the slice lies inside `v`.
            let b = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, bytes) };
            fill(b);
            return f(b);
        }
        f(self.panels.get_or_init(|| Kept::new(bytes, fill)).bytes())
    }

    /// The kept GEMM panels (`bytes` bytes, filled by `fill` on the first call), or None where
    /// they are not kept (a view, or the panel budget spent): then nothing is packed here.
    pub(crate) fn kept_gemm_panels(&self, bytes: usize, fill: impl FnOnce(&mut [u8])) -> Option<&[u8]> {
        if self.panels.get().is_none() && (self.view || !reserve_panel_bytes(bytes)) {
            return None;
        }
        self.panels.get_or_init(|| Kept::new(bytes, fill)).bytes().get(..bytes)
    }

    /// Whether this is a per-call view of one expert (nothing is kept on it).
    pub(crate) fn is_view(&self) -> bool {
        self.view
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

/// Bytes the process keeps as GEMM panels at most (beyond, the matmul packs per call).
const PANEL_BUDGET: usize = 1024 << 20;

/// Take `bytes` from the process-wide budget for kept GEMM panels ([`PANEL_BUDGET`]); false
/// when it is spent (the caller packs per call).
fn reserve_panel_bytes(bytes: usize) -> bool {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static USED: AtomicUsize = AtomicUsize::new(0);
    USED.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| (u + bytes <= PANEL_BUDGET).then_some(u + bytes)).is_ok()
}

/// Ask the kernel to reclaim the pages that lie wholly inside `bytes` (Linux
/// `MADV_PAGEOUT`: clean file pages of the mmap are dropped, anonymous memory is swapped out
/// or kept - never lost; a later read faults them back in). Elsewhere, or where the kernel
/// refuses, nothing happens: it only lowers the resident set.
fn release_pages(bytes: &[u8]) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let (start, end) = (bytes.as_ptr() as usize, bytes.as_ptr() as usize + bytes.len());
        let (a, b) = (start.div_ceil(PAGE) * PAGE, end / PAGE * PAGE);
        if b > a {
            // SAFETY: the range lies inside `bytes` (page-aligned inward); MADV_PAGEOUT does
            // not change the contents any later read sees.
            unsafe { libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_PAGEOUT) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = bytes;
}
