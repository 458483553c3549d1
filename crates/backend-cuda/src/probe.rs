//! Entry points that run one path of an op directly, for tests and benchmarks (the device
//! router against the host reference, MMQ and cuBLAS at any token count), and device probes
//! (memory, copy bandwidth).

use crate::runtime::DevMem;
use crate::{check_len, mmq, CudaBackend, CudaBuf, CudaWeight};
use quarrel_core::{CoreError, MoeRouting, Result, Route};

impl CudaBackend {
    /// Route `logits (n_tok, n_expert)` with the device router (`moe_dev`, as decode steps do)
    /// and download the routes: the kernel against `quarrel_core::moe::route_reference`.
    pub fn moe_route_on_device(&self, logits: &CudaBuf, bias: Option<&CudaBuf>, p: &MoeRouting) -> Result<Vec<Route>> {
        self.dev.bind()?;
        let n_tok = logits.len / p.n_expert.max(1);
        if p.n_expert == 0 || p.n_used == 0 || p.n_used > p.n_expert.min(8) || p.n_expert > 1024 || logits.len != n_tok * p.n_expert {
            return Err(CoreError::Shape(format!("device routing of {} logits, {} of {} experts", logits.len, p.n_used, p.n_expert)));
        }
        let bias = match bias {
            Some(b) => self.rd(b)?,
            None => 0,
        };
        let ph = self.router.route(&self.dev, None, self.rd(logits)?, n_tok, bias, p)?;
        Ok(self.router.download_last(&self.dev, &ph)?)
    }

    /// The router matmul and the routing in one launch (`moe_router_f32`, as decode steps run
    /// it) with the routes downloaded: the fused kernel against `matmul` + the host reference.
    pub fn moe_router_on_device(
        &self,
        w: &CudaWeight,
        x: &CudaBuf,
        n_tok: usize,
        bias: Option<&CudaBuf>,
        p: &MoeRouting,
    ) -> Result<Vec<Route>> {
        self.dev.bind()?;
        check_len("router input", x.len, n_tok * w.n_in)?;
        let bias = match bias {
            Some(b) => self.rd(b)?,
            None => 0,
        };
        let ph = self.router.route_fused(&self.dev, &self.qcache, None, w, self.rd(x)?, n_tok, bias, p)?;
        let ph = ph.ok_or_else(|| CoreError::Unsupported(format!("fused router: {n_tok} tokens, {} weights, {p:?}", w.dev_ty.name())))?;
        Ok(self.router.download_last(&self.dev, &ph)?)
    }

    /// The shape checks of a matmul entry point and its (input, output) device pointers.
    fn matmul_ptrs(&self, w: &CudaWeight, x: &CudaBuf, n_tok: usize, out: &mut CudaBuf) -> Result<(u64, u64)> {
        self.dev.bind()?;
        check_len("matmul input", x.len, n_tok * w.n_in)?;
        check_len("matmul output", out.len, n_tok * w.n_out)?;
        let xp = self.rd(x)?;
        Ok((xp, self.wr(out)))
    }

    /// `out = x · Wᵀ` through the MMQ kernels whatever the token count (tests, benchmarks).
    pub fn matmul_mmq(&self, w: &CudaWeight, x: &CudaBuf, n_tok: usize, out: &mut CudaBuf) -> Result<()> {
        let (xp, op) = self.matmul_ptrs(w, x, n_tok, out)?;
        if let Ok(mut g) = self.qcache.lock() {
            if g.as_ref().is_some_and(|c| c.x == op) {
                *g = None;
            }
        }
        Ok(mmq::mmq(&self.dev, &self.qcache, w, xp, n_tok, op, true)?)
    }

    /// The cuBLAS GEMM path of `matmul` at any token count (benchmarks compare it with MMQ).
    pub fn matmul_gemm(&self, w: &CudaWeight, x: &CudaBuf, n_tok: usize, out: &mut CudaBuf) -> Result<()> {
        let (xp, op) = self.matmul_ptrs(w, x, n_tok, out)?;
        Ok(crate::matmul::gemm(&self.dev, &self.blas, w, xp, n_tok, op)?)
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> (usize, usize) {
        self.dev.ctx.mem_get_info().unwrap_or((0, 0))
    }

    /// Wait for all queued work (for timing).
    pub fn synchronize(&self) -> Result<()> {
        self.dev.flush()?;
        self.dev.stream.synchronize().map_err(|e| CoreError::Backend(format!("synchronize: {e:?}")))
    }

    /// Device-to-device copy bandwidth (bytes read + written per second) over `bytes`.
    pub fn copy_bandwidth(&self, bytes: usize, reps: usize) -> Result<f64> {
        use cudarc::driver::result as r;
        self.dev.bind()?;
        self.dev.flush()?;
        let a = DevMem::alloc(&self.dev, bytes)?;
        let b = DevMem::alloc(&self.dev, bytes)?;
        let s = self.dev.stream.cu_stream();
        // SAFETY: two live allocations of `bytes`.
        let copy = || unsafe { r::memcpy_dtod_async(b.ptr, a.ptr, bytes, s) };
        copy().map_err(|e| CoreError::Backend(format!("{e:?}")))?;
        self.synchronize()?;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            copy().map_err(|e| CoreError::Backend(format!("{e:?}")))?;
        }
        self.synchronize()?;
        Ok(2.0 * bytes as f64 * reps as f64 / t.elapsed().as_secs_f64())
    }
}
