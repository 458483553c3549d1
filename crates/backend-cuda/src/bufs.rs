//! Buffer access for the backend's ops and the Q8 activation cache: reads run a buffer's
//! deferred zeroing first, writes make the cached Q8 form of that buffer stale, and an op that
//! writes its output's Q8 form too (norms, activations) records it for the matmul that follows.

use crate::{matmul, CudaBackend, CudaBuf};
use quarrel_core::{CoreError, Result};
use std::sync::atomic::Ordering;

impl CudaBackend {
    /// A write to `ptr` makes the cached quantized activations stale if they came from it.
    pub(crate) fn written(&self, ptr: u64) {
        for q in [&self.qcache, &self.qprev] {
            if let Ok(mut g) = q.lock() {
                if g.as_ref().is_some_and(|c| c.x == ptr) {
                    *g = None;
                }
            }
        }
    }

    /// Move the current cache entry, if it is `x`'s, to the previous slot (an op about to write
    /// another buffer's Q8 form in the same launch keeps both).
    pub(crate) fn keep_q8_as_previous(&self, x: u64) -> Result<()> {
        let first = self.qcache.lock().map_err(|_| CoreError::Backend("lock poisoned".into()))?.take();
        *self.qprev.lock().map_err(|_| CoreError::Backend("lock poisoned".into()))? = first.filter(|c| c.x == x);
        Ok(())
    }

    /// Before an op that reads `x`'s Q8 form: the previous cache entry back in if it is x's.
    pub(crate) fn promote_q8(&self, x: u64) {
        if let (Ok(mut c), Ok(mut p)) = (self.qcache.lock(), self.qprev.lock()) {
            if p.as_ref().is_some_and(|q| q.x == x) && c.as_ref().is_none_or(|q| q.x != x) {
                std::mem::swap(&mut *c, &mut *p);
            }
        }
    }

    /// Q8 scratch for an op that writes `n` values at `out` and their Q8 form in one go
    /// (`None`: kernel arguments 0, the op writes f32 only).
    pub(crate) fn q8_out(&self, out: u64, n: usize) -> Result<(u64, u64)> {
        if !n.is_multiple_of(32) {
            return Ok((0, 0));
        }
        let c = matmul::QCache::new(&self.dev, out, n)?;
        let ptrs = (c.xq.ptr(), c.xm.ptr());
        *self.qcache.lock().map_err(|_| CoreError::Backend("lock poisoned".into()))? = Some(c);
        Ok(ptrs)
    }

    /// The pointer of a buffer an op reads (running its deferred zeroing first).
    pub(crate) fn rd(&self, b: &CudaBuf) -> Result<u64> {
        if b.zero_pending.swap(false, Ordering::AcqRel) {
            self.dev.zero(b.ptr(), 4 * b.len)?;
            self.written(b.ptr());
        }
        Ok(b.ptr())
    }

    /// The pointer of a buffer an op reads and updates in place.
    pub(crate) fn rw(&self, b: &mut CudaBuf) -> Result<u64> {
        let p = self.rd(b)?;
        self.written(p);
        Ok(p)
    }

    /// The pointer of a buffer an op overwrites completely.
    pub(crate) fn wr(&self, b: &mut CudaBuf) -> u64 {
        b.zero_pending.store(false, Ordering::Release);
        self.written(b.ptr());
        b.ptr()
    }
}
