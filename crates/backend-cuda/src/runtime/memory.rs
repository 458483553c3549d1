//! Device memory: raw allocations (`DevMem`) and the buffer pool (`Pool`, `PoolMem`) that hands
//! the same addresses to the same sequence of allocations every step.

use super::device::{Deferred, Device};
use crate::error::{drv, CudaError};
use cudarc::driver::{result, sys};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// A raw device allocation, freed on drop.
pub struct DevMem {
    pub ptr: u64,
    pub bytes: usize,
}

impl DevMem {
    pub fn alloc<H: Deferred>(dev: &Device<H>, bytes: usize) -> Result<DevMem, CudaError> {
        dev.bind()?;
        // SAFETY: plain cuMemAlloc of a positive size.
        let ptr = unsafe { result::malloc_sync(bytes.max(256)) }.map_err(|e| oom_or(e, bytes, dev))?;
        Ok(DevMem { ptr, bytes })
    }

    /// Allocate and copy `src` (synchronously: used at load time).
    ///
    /// The copy goes through the backend's stream and is waited for. A plain `cuMemcpyHtoD`
    /// runs on the legacy default stream, which a non-blocking stream (ours, cudarc's
    /// `new_stream`) does not wait for, and from pageable memory it returns once the source is
    /// staged, before the DMA has landed: a kernel launched right after the load read the
    /// table's last rows (copied last) before they arrived (`tests/numerics.rs`,
    /// `fresh_tables_read_right_after_load`).
    pub fn upload<T: Copy, H: Deferred>(dev: &Device<H>, src: &[T]) -> Result<DevMem, CudaError> {
        let m = DevMem::alloc(dev, std::mem::size_of_val(src))?;
        if !src.is_empty() {
            // SAFETY: the allocation holds size_of_val(src) bytes; pageable sources are staged
            // before the call returns, and the stream is synchronized before `m` is used.
            unsafe { result::memcpy_htod_async(m.ptr, src, dev.stream.cu_stream()) }.map_err(drv("upload"))?;
            dev.stream.synchronize().map_err(drv("synchronizing after an upload"))?;
        }
        Ok(m)
    }
}

impl Drop for DevMem {
    fn drop(&mut self) {
        // SAFETY: ptr came from cuMemAlloc; freeing synchronizes with pending work.
        unsafe {
            let _ = result::free_sync(self.ptr);
        }
    }
}

fn oom_or<H: Deferred>(e: result::DriverError, bytes: usize, dev: &Device<H>) -> CudaError {
    if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
        let (free, total) = dev.ctx.mem_get_info().unwrap_or((0, 0));
        CudaError::OutOfMemory(format!(
            "allocating {:.1} MiB on {} ({:.0} of {:.0} MiB free)",
            bytes as f64 / 1048576.0,
            dev.name,
            free as f64 / 1048576.0,
            total as f64 / 1048576.0
        ))
    } else {
        CudaError::Driver(format!("allocating {bytes} bytes: {e:?}"))
    }
}

/// Reuses device allocations by size: model code allocates its intermediates every step.
///
/// Buffers dropped while launches are queued (see `Device::flush`) are held back until the
/// queue has been submitted, and a size class hands out its lowest address first: the same
/// sequence of allocations gets the same pointers every step, which lets a recorded step
/// (a CUDA graph) be replayed.
#[derive(Default)]
pub struct Pool {
    free: Mutex<HashMap<usize, BTreeMap<u64, DevMem>>>,
    garbage: Mutex<Vec<DevMem>>,
}

impl Pool {
    fn class(bytes: usize) -> usize {
        bytes.max(1).div_ceil(512) * 512
    }

    pub(super) fn take<H: Deferred>(&self, dev: &Device<H>, bytes: usize) -> Result<DevMem, CudaError> {
        let c = Self::class(bytes);
        let hit = self.free.lock().map_err(|_| CudaError::Driver("pool lock poisoned".into()))?.get_mut(&c).and_then(|m| m.pop_first());
        if let Some((_, m)) = hit {
            return Ok(m);
        }
        DevMem::alloc(dev, c)
    }

    pub(super) fn put(&self, m: DevMem) {
        if let Ok(mut g) = self.garbage.lock() {
            g.push(m);
        }
    }

    /// Make the buffers dropped since the last call available again (all their uses are
    /// submitted to the stream by now).
    pub(super) fn release(&self) {
        let g = self.garbage.lock().map(|mut g| std::mem::take(&mut *g)).unwrap_or_default();
        if let Ok(mut f) = self.free.lock() {
            for m in g {
                f.entry(m.bytes).or_default().insert(m.ptr, m);
            }
        }
    }

    /// Give every cached buffer back to the driver.
    pub(super) fn clear(&self) {
        if let Ok(mut f) = self.free.lock() {
            f.clear();
        }
    }
}

/// A pooled allocation that returns to its pool on drop.
pub struct PoolMem {
    pub(super) mem: Option<DevMem>,
    pub(super) pool: Arc<Pool>,
}

impl PoolMem {
    pub fn ptr(&self) -> u64 {
        self.mem.as_ref().map_or(0, |m| m.ptr)
    }
}

impl Drop for PoolMem {
    fn drop(&mut self) {
        if let Some(m) = self.mem.take() {
            self.pool.put(m);
        }
    }
}
