//! The device: context, stream, kernel modules (compiled by `nvrtc`), the buffer pool, and
//! launches into the queue. One launch may be held back for fusion with the next op (a
//! `Deferred` value the crate's fusion step defines): every other launch, flush and download
//! submits it first, so the queue keeps the program's order.

use super::memory::{Pool, PoolMem};
use super::nvrtc;
use super::queue::{Queue, Rec};
use crate::error::{drv, CudaError};
use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaModule, CudaStream};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A launch held back for fusion with the op that follows: the runtime only stores it and
/// launches it (`launch`) before anything else reaches the queue.
pub trait Deferred: Sized {
    fn launch(self, dev: &Device<Self>) -> Result<(), CudaError>;
}

/// One kernel the compiled units export.
pub struct Kernel {
    pub name: String,
    /// The kernel waits for its predecessor itself (`GDC()`, kernels/common.cuh), so it may be
    /// launched with programmatic dependent launch.
    pub waits: bool,
}

/// Whether a CUDA driver library can be loaded and reports at least one device.
pub fn device_count() -> usize {
    // SAFETY: only probes for the shared library.
    if !unsafe { sys::is_culib_present() } {
        return 0;
    }
    if result::init().is_err() {
        return 0;
    }
    CudaContext::device_count().map(|n| n.max(0) as usize).unwrap_or(0)
}

/// Whether the CUDA backend can start here: a driver with a GPU, NVRTC and cuBLAS.
pub fn available() -> bool {
    // SAFETY: only probe for the shared libraries.
    device_count() > 0 && unsafe { cudarc::nvrtc::sys::is_culib_present() && cudarc::cublas::sys::is_culib_present() }
}

pub struct Device<H> {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub name: String,
    pub cc: (i32, i32),
    /// Multiprocessors.
    pub n_sm: usize,
    pub pool: Arc<Pool>,
    _modules: Vec<Arc<CudaModule>>,
    /// Each kernel and whether it is launched with PDL.
    funcs: HashMap<String, (CudaFunction, bool)>,
    queue: Mutex<Queue>,
    /// A launch held back because the next op may absorb it; any other launch and every flush
    /// submit it first.
    held: Mutex<Option<H>>,
    /// `resident_blocks` answers by (kernel, threads, shared memory).
    resident: Mutex<HashMap<(String, u32, u32), usize>>,
    /// The dynamic shared memory each kernel was allowed past 48 KB (`allow_smem`).
    smem_allowed: Mutex<HashMap<String, u32>>,
}

impl<H: Deferred> Device<H> {
    /// The device `ordinal` with `program`'s units loaded and `kernels` looked up in them
    /// (programmatic dependent launch, sm_90+, for those that wait for their predecessor).
    pub fn new(ordinal: usize, program: &nvrtc::Program, kernels: &[Kernel]) -> Result<Device<H>, CudaError> {
        let n = device_count();
        if n == 0 {
            return Err(CudaError::NoDevice("no CUDA driver (libcuda.so) or no CUDA device found".into()));
        }
        if ordinal >= n {
            return Err(CudaError::NoDevice(format!("CUDA device {ordinal} requested, {n} present")));
        }
        let ctx = CudaContext::new(ordinal).map_err(drv("creating the CUDA context"))?;
        // SAFETY: this backend uses one stream and raw pointers, no CudaSlice.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv("creating a stream"))?;
        let name = ctx.name().unwrap_or_else(|_| "CUDA device".into());
        let cc = ctx.compute_capability().map_err(drv("compute capability"))?;
        let n_sm =
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).map_err(drv("multiprocessor count"))?.max(1)
                as usize;
        let mut modules = Vec::new();
        let dir = &crate::tuning::get().cache_dir;
        for (unit, code) in program.units.iter().zip(nvrtc::compile_all(dir, program, cc)?) {
            let module = match ctx.load_module(code) {
                Ok(m) => m,
                // a CUBIN the driver cannot take (NVRTC newer than the driver): PTX, JIT-compiled
                Err(_) => ctx
                    .load_module(nvrtc::compile_unit(dir, program, unit, cc, nvrtc::Target::Ptx)?)
                    .map_err(drv("loading a kernel module"))?,
            };
            modules.push(module);
        }
        let pdl = cc.0 >= 9;
        let mut funcs = HashMap::new();
        for k in kernels {
            if funcs.contains_key(&k.name) {
                continue;
            }
            let f = modules
                .iter()
                .find_map(|m| m.load_function(&k.name).ok())
                .ok_or_else(|| CudaError::Driver(format!("kernel {} is in no compiled unit (src/kernels.rs UNITS)", k.name)))?;
            funcs.insert(k.name.clone(), (f, pdl && k.waits));
        }
        Ok(Device {
            ctx,
            stream,
            name,
            cc,
            n_sm,
            pool: Arc::new(Pool::default()),
            _modules: modules,
            funcs,
            queue: Mutex::new(Default::default()),
            held: Mutex::new(None),
            resident: Mutex::new(HashMap::new()),
            smem_allowed: Mutex::new(HashMap::new()),
        })
    }

    pub fn bind(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(drv("binding the context"))
    }

    pub fn func(&self, name: &str) -> Result<&CudaFunction, CudaError> {
        self.kernel(name).map(|k| &k.0)
    }

    fn kernel(&self, name: &str) -> Result<&(CudaFunction, bool), CudaError> {
        self.funcs.get(name).ok_or_else(|| CudaError::Driver(format!("kernel {name} missing from the module")))
    }

    /// Blocks of `threads` threads and `smem` bytes of dynamic shared memory of kernel `name`
    /// that one multiprocessor holds at once (the driver's occupancy answer for the kernel's
    /// registers too; at least 1).
    pub(crate) fn resident_blocks(&self, name: &str, threads: u32, smem: u32) -> Result<usize, CudaError> {
        let key = (name.to_string(), threads, smem);
        if let Some(n) = self.resident.lock().map_err(|_| CudaError::Driver("occupancy lock poisoned".into()))?.get(&key) {
            return Ok(*n);
        }
        let f = self.func(name)?;
        self.allow_smem(name, f, smem)?;
        let n = f.occupancy_max_active_blocks_per_multiprocessor(threads, smem as usize, None).map_err(drv("occupancy"))?.max(1) as usize;
        self.resident.lock().map_err(|_| CudaError::Driver("occupancy lock poisoned".into()))?.insert(key, n);
        Ok(n)
    }

    /// Let kernel `name` take `smem` bytes of dynamic shared memory (past 48 KB the driver wants
    /// it asked for): one driver call per kernel and larger size, not one per launch.
    fn allow_smem(&self, name: &str, f: &CudaFunction, smem: u32) -> Result<(), CudaError> {
        if smem <= 48 * 1024 {
            return Ok(());
        }
        let mut allowed = self.smem_allowed.lock().map_err(|_| CudaError::Driver("shared memory lock poisoned".into()))?;
        if allowed.get(name).is_some_and(|&a| a >= smem) {
            return Ok(());
        }
        f.set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
            .map_err(drv("shared memory attribute"))?;
        allowed.insert(name.to_string(), smem);
        Ok(())
    }

    /// A pooled buffer of at least `bytes` (contents undefined).
    pub fn scratch(&self, bytes: usize) -> Result<PoolMem, CudaError> {
        let m = match self.pool.take(self, bytes) {
            Err(CudaError::OutOfMemory(_)) => {
                // submit what is queued, give cached buffers back to the driver, try again
                self.flush()?;
                self.pool.clear();
                self.pool.take(self, bytes)?
            }
            r => r?,
        };
        Ok(PoolMem { mem: Some(m), pool: Arc::clone(&self.pool) })
    }

    /// Submit the queued launches (replaying a recorded graph where the step repeats) and
    /// recycle the buffers dropped meanwhile.
    pub fn flush(&self) -> Result<(), CudaError> {
        self.settle()?;
        let mut q = self.queue.lock().map_err(|_| CudaError::Driver("queue lock poisoned".into()))?;
        let r = q.submit(&self.stream);
        drop(q);
        self.pool.release();
        r
    }

    /// A step begins (the token embedding): a step of more tokens than a decode step
    /// (`large`) is never captured as graphs (`Queue::large_step`).
    pub fn step_begins(&self, large: bool) {
        if let Ok(mut q) = self.queue.lock() {
            q.large_step = large;
        }
    }

    /// Run `f` (a library call on the stream, e.g. cuBLAS), its host time counted under `what`
    /// when `QUARREL_CUDA_PROFILE=host`.
    pub(crate) fn timed<T>(&self, what: &'static str, f: impl FnOnce() -> T) -> T {
        let t = std::time::Instant::now();
        let r = f();
        if let Ok(mut q) = self.queue.lock() {
            if let Some(h) = q.host.as_mut() {
                let e = h.calls.entry(what).or_default();
                e.0 += t.elapsed().as_secs_f64();
                e.1 += 1;
            }
        }
        r
    }

    /// The next queued step cannot become a graph (it calls a library, e.g. cuBLAS).
    pub fn not_graphable(&self) {
        if let Ok(mut q) = self.queue.lock() {
            q.graphable = false;
        }
    }

    /// Upload `src` into a pooled buffer, stream-ordered (the host copy is staged at once).
    pub fn upload_async<T: Copy>(&self, src: &[T]) -> Result<PoolMem, CudaError> {
        let m = self.scratch(std::mem::size_of_val(src))?;
        if !src.is_empty() {
            // SAFETY: the buffer holds at least size_of_val(src) bytes; pageable sources are
            // staged before the call returns.
            unsafe { result::memcpy_htod_async(m.ptr(), src, self.stream.cu_stream()) }.map_err(drv("upload"))?;
        }
        Ok(m)
    }

    /// Zero `bytes` (a multiple of 4) at `ptr`, in queue order.
    pub fn zero(&self, ptr: u64, bytes: usize) -> Result<(), CudaError> {
        let n = (bytes / 4) as u64;
        self.launch_1d("zero_fill", n, &[Arg::P(ptr), Arg::U64(n)])
    }

    pub fn memset0(&self, ptr: u64, bytes: usize) -> Result<(), CudaError> {
        // SAFETY: callers pass a live allocation of at least `bytes`.
        unsafe { result::memset_d8_async(ptr, 0, bytes, self.stream.cu_stream()) }.map_err(drv("memset"))
    }

    pub fn download<T: Copy + Default>(&self, ptr: u64, n: usize) -> Result<Vec<T>, CudaError> {
        self.flush()?;
        let mut v = vec![T::default(); n];
        if n > 0 {
            // SAFETY: ptr holds at least n values of T; the stream is synchronized before return.
            unsafe { result::memcpy_dtoh_async(&mut v, ptr, self.stream.cu_stream()) }.map_err(drv("download"))?;
        }
        let t = std::time::Instant::now();
        self.stream.synchronize().map_err(drv("synchronizing after a download"))?;
        if let Ok(mut q) = self.queue.lock() {
            q.idle = true;
            if let Some(h) = q.host.as_mut() {
                h.steps += 1;
                h.wait += t.elapsed().as_secs_f64();
                h.last = None;
            }
        }
        Ok(v)
    }

    /// Hold `h` back (submitting what was held before).
    pub(crate) fn hold(&self, h: H) -> Result<(), CudaError> {
        self.settle()?;
        *self.held.lock().map_err(|_| CudaError::Driver("lock poisoned".into()))? = Some(h);
        Ok(())
    }

    /// The held launch, if `f` accepts it (else it stays held).
    pub(crate) fn take_held_if(&self, f: impl FnOnce(&H) -> bool) -> Option<H> {
        let mut g = self.held.lock().ok()?;
        if g.as_ref().is_some_and(f) {
            g.take()
        } else {
            None
        }
    }

    /// Queue the held launch, if any.
    pub fn settle(&self) -> Result<(), CudaError> {
        let h = self.held.lock().map_err(|_| CudaError::Driver("lock poisoned".into()))?.take();
        match h {
            None => Ok(()),
            Some(h) => h.launch(self),
        }
    }

    /// Launch `name` on the stream; `args` in the kernel's parameter order.
    pub fn launch(&self, name: &str, grid: (u32, u32, u32), block: u32, smem: u32, args: &[Arg]) -> Result<(), CudaError> {
        self.settle()?;
        self.launch_now(name, grid, block, smem, args)
    }

    /// `launch` without submitting the held launch first.
    pub(crate) fn launch_now(&self, name: &str, grid: (u32, u32, u32), block: u32, smem: u32, args: &[Arg]) -> Result<(), CudaError> {
        let (f, pdl) = self.kernel(name)?;
        self.allow_smem(name, f, smem)?;
        // every parameter is at most 8 bytes: one little-endian slot each
        let args: Vec<u64> = args.iter().map(|a| a.bits()).collect();
        let rec = Rec { func: f.cu_function() as usize, grid, block, smem, args, pdl: *pdl };
        let mut q = self.queue.lock().map_err(|_| CudaError::Driver("queue lock poisoned".into()))?;
        if q.push(rec) {
            // a full segment goes to the GPU now: it runs while the host records the next
            let r = q.submit(&self.stream);
            drop(q);
            self.pool.release();
            r?;
        }
        Ok(())
    }

    /// One thread per element, 256 to a block.
    pub fn launch_1d(&self, name: &str, n: u64, args: &[Arg]) -> Result<(), CudaError> {
        self.settle()?;
        self.launch_1d_now(name, n, args)
    }

    /// `launch_1d` without submitting the held launch first.
    pub(crate) fn launch_1d_now(&self, name: &str, n: u64, args: &[Arg]) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let blocks = n.div_ceil(256);
        if blocks > u32::MAX as u64 {
            return Err(CudaError::Shape(format!("{name}: {n} elements is too many for one launch")));
        }
        self.launch_now(name, (blocks as u32, 1, 1), 256, 0, args)
    }
}

/// A kernel argument.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// device pointer
    P(u64),
    I(i32),
    U64(u64),
    F(f32),
}

impl Arg {
    /// The parameter slot's bits (every parameter is at most 8 bytes, little-endian).
    pub fn bits(self) -> u64 {
        match self {
            Arg::P(v) | Arg::U64(v) => v,
            Arg::I(v) => v as u32 as u64,
            Arg::F(v) => v.to_bits() as u64,
        }
    }
}

impl<H> Device<H> {
    /// The name of a loaded kernel function (reports).
    fn func_name(&self, f: usize) -> String {
        self.funcs.iter().find(|(_, (func, _))| func.cu_function() as usize == f).map_or("?".to_string(), |(k, _)| k.clone())
    }
}

impl<H> Drop for Device<H> {
    fn drop(&mut self) {
        if let Some(h) = self.queue.lock().ok().and_then(|mut q| q.host.take()) {
            let per = |x: f64| 1e6 * x / h.steps.max(1) as f64;
            eprintln!(
                "\nCUDA host times (QUARREL_CUDA_PROFILE=host), {} steps (downloads), {} segments: recording {:.0} us/step, submitting {:.0} us/step, waiting for the GPU {:.0} us/step",
                h.steps,
                h.segments,
                per(h.record),
                per(h.submit),
                per(h.wait)
            );
            let mut rows: Vec<(String, f64, u64)> = h.before.iter().map(|(f, &(s, n))| (self.func_name(*f), s, n)).collect();
            rows.sort_by(|a, b| b.1.total_cmp(&a.1));
            eprintln!("| host time before launching | us/step | launches/step | us/launch |\n|---|---:|---:|---:|");
            for (name, s, n) in rows.iter().take(16) {
                eprintln!("| {name} | {:.0} | {:.1} | {:.1} |", per(*s), *n as f64 / h.steps.max(1) as f64, 1e6 * s / *n as f64);
            }
            for (name, (s, n)) in &h.calls {
                eprintln!("| (call) {name} | {:.0} | {:.1} | {:.1} |", per(*s), *n as f64 / h.steps.max(1) as f64, 1e6 * s / *n as f64);
            }
        }
        let prof = self.queue.lock().ok().and_then(|mut q| q.profile.take());
        if let Some(prof) = prof {
            let mut rows: Vec<(String, f64, u64)> = prof.iter().map(|(f, &(ms, n))| (self.func_name(*f), ms, n)).collect();
            rows.sort_by(|a, b| b.1.total_cmp(&a.1));
            let total: f64 = rows.iter().map(|r| r.1).sum();
            let launches: u64 = rows.iter().map(|r| r.2).sum();
            eprintln!("\nCUDA kernel profile (QUARREL_CUDA_PROFILE=kernels): {total:.1} ms GPU time, {launches} launches");
            eprintln!("| kernel | ms | launches | us/launch | % |\n|---|---:|---:|---:|---:|");
            for (name, ms, n) in rows.iter().take(40) {
                eprintln!("| {name} | {ms:.2} | {n} | {:.1} | {:.1} |", 1e3 * ms / *n as f64, 100.0 * ms / total.max(1e-9));
            }
        }
    }
}
