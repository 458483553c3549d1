//! Expert weights under a device-memory budget (`--expert-budget`).
//!
//! ```text
//!  load: 3-D expert tensor ──fits the budget left?──► yes: resident on the device (as any weight)
//!                                                 └─► no: Offload: repacked planes in pinned host
//!                                                     memory + `slots` device slices (what is left
//!                                                     of the budget, whole experts)
//!  moe_matmul, per routed expert e of an Offload tensor:
//!     e in a slot ──► that slot (hit)
//!     else ──► least recently used slot (ties: fewer routings) ◄──upload── host slice of e
//!              (no slots at all: a pooled staging slice for this matmul only)
//! ```
//!
//! Uploads are stream-ordered after everything queued before them (the queue is flushed first),
//! so a slot that an earlier matmul of the same step read is overwritten only after that matmul.
//! The counters (`ExpertBudget::stats`) say how often experts were found on the device.

use crate::error::{drv, CudaError};
use crate::fusion::Device;
use crate::runtime::{DevMem, PoolMem};
use cudarc::driver::result;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Device bytes left for expert tensors, shared by all of a model's expert weights (loaded in
/// file order: earlier layers' experts stay resident first).
pub struct ExpertBudget {
    left: Mutex<Option<usize>>,
    /// Some expert tensor lives in host memory (decode then routes on the host).
    offloaded: std::sync::atomic::AtomicBool,
    hits: AtomicU64,
    uploads: AtomicU64,
    upload_bytes: AtomicU64,
}

/// What the expert cache did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpertStats {
    /// Routed experts of offloaded tensors found on the device.
    pub hits: u64,
    /// Routed experts uploaded from host memory.
    pub uploads: u64,
    pub upload_bytes: u64,
}

impl ExpertBudget {
    pub fn new(bytes: Option<usize>) -> ExpertBudget {
        ExpertBudget {
            left: Mutex::new(bytes),
            offloaded: Default::default(),
            hits: AtomicU64::new(0),
            uploads: AtomicU64::new(0),
            upload_bytes: AtomicU64::new(0),
        }
    }

    /// Set the budget (`None`: unlimited) for the weights loaded from now on.
    pub fn set(&self, bytes: Option<usize>) {
        if let Ok(mut l) = self.left.lock() {
            *l = bytes;
        }
    }

    /// Take `bytes` from the budget if they fit (always, when unlimited).
    pub(crate) fn take(&self, bytes: usize) -> bool {
        let Ok(mut l) = self.left.lock() else { return false };
        match *l {
            None => true,
            Some(left) if left >= bytes => {
                *l = Some(left - bytes);
                true
            }
            Some(_) => false,
        }
    }

    /// Take as many whole slices of `slice` bytes as fit (at most `max`).
    pub(crate) fn take_slices(&self, slice: usize, max: usize) -> usize {
        let Ok(mut l) = self.left.lock() else { return 0 };
        let n = match *l {
            None => max,
            Some(left) => (left / slice.max(1)).min(max),
        };
        if let Some(left) = l.as_mut() {
            *left -= n * slice;
        }
        n
    }

    /// Whether some expert tensor was kept in host memory.
    pub fn any_offloaded(&self) -> bool {
        self.offloaded.load(Ordering::Relaxed)
    }

    pub(crate) fn mark_offloaded(&self) {
        self.offloaded.store(true, Ordering::Relaxed);
    }

    pub fn stats(&self) -> ExpertStats {
        ExpertStats {
            hits: self.hits.load(Ordering::Relaxed),
            uploads: self.uploads.load(Ordering::Relaxed),
            upload_bytes: self.upload_bytes.load(Ordering::Relaxed),
        }
    }
}

/// Page-locked host memory (`cuMemHostAlloc`), freed on drop.
pub struct PinnedHost {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the allocation is plain bytes owned by this value; it is only read after creation.
unsafe impl Send for PinnedHost {}
// SAFETY: as above (shared access is read-only).
unsafe impl Sync for PinnedHost {}

impl PinnedHost {
    pub fn copy_of(dev: &Device, src: &[u8]) -> Result<PinnedHost, CudaError> {
        dev.bind()?;
        // SAFETY: a positive size; flags 0 (portable pinned memory of this context).
        let ptr = unsafe { result::malloc_host(src.len().max(1), 0) }.map_err(|e| {
            CudaError::OutOfMemory(format!("pinning {:.1} MiB of host memory for offloaded experts: {e:?}", src.len() as f64 / 1048576.0))
        })? as *mut u8;
        // SAFETY: the allocation holds src.len() bytes and does not overlap src.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr, src.len()) };
        Ok(PinnedHost { ptr, len: src.len() })
    }

    fn slice(&self, at: usize, len: usize) -> &[u8] {
        assert!(at + len <= self.len, "pinned slice {at}+{len} of {}", self.len);
        // SAFETY: in bounds (checked) of a live allocation written once at creation.
        unsafe { std::slice::from_raw_parts(self.ptr.add(at), len) }
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        // SAFETY: ptr came from cuMemHostAlloc.
        unsafe {
            let _ = result::free_host(self.ptr as *mut _);
        }
    }
}

struct Slots {
    /// Expert -> slot holding it.
    slot_of: Vec<Option<usize>>,
    /// Slot -> expert in it.
    owner: Vec<Option<usize>>,
    /// Slot -> tick of its last use.
    last: Vec<u64>,
    /// Routings per expert (ties between equally old slots go to the less routed expert).
    routed: Vec<u64>,
    tick: u64,
}

/// An expert tensor kept in host memory with `slots` experts cached on the device.
pub struct Offload {
    pub n_expert: usize,
    /// Bytes of one expert in the payload and meta planes.
    pub slice_p: usize,
    pub slice_m: usize,
    host_p: PinnedHost,
    host_m: Option<PinnedHost>,
    cache_p: Option<DevMem>,
    cache_m: Option<DevMem>,
    pub slots: usize,
    state: Mutex<Slots>,
}

/// Device planes of one expert for the matmul being recorded (`_staging` keeps a slice that
/// lives only for this matmul).
pub struct ExpertPtrs {
    pub p: u64,
    pub m: u64,
    _staging: Option<(PoolMem, Option<PoolMem>)>,
}

impl Offload {
    /// Planes `p`, `m` of `n_expert` equal experts: pinned host copies and as many device
    /// slots as `budget` has room for (`None`: none, every use stages its expert).
    pub fn new(dev: &Device, budget: Option<&ExpertBudget>, p: &[u8], m: Option<&[u8]>, n_expert: usize) -> Result<Offload, CudaError> {
        if n_expert == 0 || !p.len().is_multiple_of(n_expert) || m.is_some_and(|m| m.len() % n_expert != 0) {
            return Err(CudaError::Shape(format!("expert tensor of {} bytes is not {n_expert} equal experts", p.len())));
        }
        let slice_p = p.len() / n_expert;
        let slice_m = m.map_or(0, |m| m.len() / n_expert);
        let slots = budget.map_or(0, |b| b.take_slices(slice_p + slice_m, n_expert));
        let alloc = |n: usize| if n == 0 || slots == 0 { Ok(None) } else { DevMem::alloc(dev, n * slots).map(Some) };
        Ok(Offload {
            n_expert,
            slice_p,
            slice_m,
            host_p: PinnedHost::copy_of(dev, p)?,
            host_m: m.map(|m| PinnedHost::copy_of(dev, m)).transpose()?,
            cache_p: alloc(slice_p)?,
            cache_m: alloc(slice_m)?,
            slots,
            state: Mutex::new(Slots {
                slot_of: vec![None; n_expert],
                owner: vec![None; slots],
                last: vec![0; slots],
                routed: vec![0; n_expert],
                tick: 0,
            }),
        })
    }

    /// Device bytes this tensor holds (its slots).
    pub fn device_bytes(&self) -> usize {
        self.slots * (self.slice_p + self.slice_m)
    }

    /// Expert `e`'s device planes for a matmul over `rows` routed rows, uploading it when it
    /// is not cached (into the least recently used slot, or a staging slice without slots).
    pub fn expert(&self, dev: &Device, budget: &ExpertBudget, e: usize, rows: usize) -> Result<ExpertPtrs, CudaError> {
        if e >= self.n_expert {
            return Err(CudaError::Shape(format!("expert {e} of {}", self.n_expert)));
        }
        let mut st = self.state.lock().map_err(|_| CudaError::Driver("expert cache lock poisoned".into()))?;
        st.tick += 1;
        let tick = st.tick;
        st.routed[e] += rows as u64;
        if let Some(s) = st.slot_of[e] {
            st.last[s] = tick;
            budget.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(self.slot_ptrs(s));
        }
        budget.uploads.fetch_add(1, Ordering::Relaxed);
        budget.upload_bytes.fetch_add((self.slice_p + self.slice_m) as u64, Ordering::Relaxed);
        // what is queued (earlier readers of the slot) goes to the stream before the copy
        dev.not_graphable();
        dev.flush()?;
        if self.slots == 0 {
            let sp = dev.scratch(self.slice_p)?;
            let sm = if self.slice_m > 0 { Some(dev.scratch(self.slice_m)?) } else { None };
            self.upload(dev, e, sp.ptr(), sm.as_ref().map_or(0, |m| m.ptr()))?;
            return Ok(ExpertPtrs { p: sp.ptr(), m: sm.as_ref().map_or(0, |m| m.ptr()), _staging: Some((sp, sm)) });
        }
        // victim: an empty slot, else the least recently used (ties: the less routed expert)
        let s = (0..self.slots)
            .min_by_key(|&s| match st.owner[s] {
                None => (0, 0),
                Some(o) => (st.last[s], st.routed[o]),
            })
            .expect("slots > 0");
        if let Some(o) = st.owner[s] {
            st.slot_of[o] = None;
        }
        st.owner[s] = Some(e);
        st.slot_of[e] = Some(s);
        st.last[s] = tick;
        let ptrs = self.slot_ptrs(s);
        self.upload(dev, e, ptrs.p, ptrs.m)?;
        Ok(ptrs)
    }

    fn slot_ptrs(&self, s: usize) -> ExpertPtrs {
        ExpertPtrs {
            p: self.cache_p.as_ref().map_or(0, |c| c.ptr + (s * self.slice_p) as u64),
            m: self.cache_m.as_ref().map_or(0, |c| c.ptr + (s * self.slice_m) as u64),
            _staging: None,
        }
    }

    fn upload(&self, dev: &Device, e: usize, p: u64, m: u64) -> Result<(), CudaError> {
        let stream = dev.stream.cu_stream();
        // SAFETY: p / m hold a slice each; the pinned sources live as long as `self`, which
        // outlives the copies (the weight is dropped only after the device is synchronized).
        unsafe { result::memcpy_htod_async(p, self.host_p.slice(e * self.slice_p, self.slice_p), stream) }
            .map_err(drv("uploading an expert"))?;
        if let Some(hm) = &self.host_m {
            // SAFETY: as above.
            unsafe { result::memcpy_htod_async(m, hm.slice(e * self.slice_m, self.slice_m), stream) }
                .map_err(drv("uploading an expert"))?;
        }
        Ok(())
    }
}
