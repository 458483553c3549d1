//! The device: context, stream, kernel modules (compiled by `nvrtc`), raw memory and a buffer pool.

use crate::error::{drv, CudaError};
use crate::nvrtc;
use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaModule, CudaStream};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};


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

/// A raw device allocation, freed on drop.
pub struct DevMem {
    pub ptr: u64,
    pub bytes: usize,
}

impl DevMem {
    pub fn alloc(dev: &Device, bytes: usize) -> Result<DevMem, CudaError> {
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
    pub fn upload<T: Copy>(dev: &Device, src: &[T]) -> Result<DevMem, CudaError> {
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

fn oom_or(e: result::DriverError, bytes: usize, dev: &Device) -> CudaError {
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

    fn take(&self, dev: &Device, bytes: usize) -> Result<DevMem, CudaError> {
        let c = Self::class(bytes);
        let hit = self.free.lock().map_err(|_| CudaError::Driver("pool lock poisoned".into()))?.get_mut(&c).and_then(|m| m.pop_first());
        if let Some((_, m)) = hit {
            return Ok(m);
        }
        DevMem::alloc(dev, c)
    }

    fn put(&self, m: DevMem) {
        if let Ok(mut g) = self.garbage.lock() {
            g.push(m);
        }
    }

    /// Make the buffers dropped since the last call available again (all their uses are
    /// submitted to the stream by now).
    fn release(&self) {
        let g = self.garbage.lock().map(|mut g| std::mem::take(&mut *g)).unwrap_or_default();
        if let Ok(mut f) = self.free.lock() {
            for m in g {
                f.entry(m.bytes).or_default().insert(m.ptr, m);
            }
        }
    }

    /// Give every cached buffer back to the driver.
    fn clear(&self) {
        if let Ok(mut f) = self.free.lock() {
            f.clear();
        }
    }
}

/// A pooled allocation that returns to its pool on drop.
pub struct PoolMem {
    mem: Option<DevMem>,
    pool: Arc<Pool>,
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

pub struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub name: String,
    pub cc: (i32, i32),
    /// Multiprocessors.
    pub n_sm: usize,
    pub pool: Arc<Pool>,
    _modules: Vec<Arc<CudaModule>>,
    funcs: HashMap<String, CudaFunction>,
    queue: Mutex<crate::graph::Queue>,
    /// A launch held back because the next op may absorb it (`Held`); any other launch and
    /// every flush submit it first.
    held: Mutex<Option<Held>>,
    /// Programmatic dependent launch for the kernels that wait for their predecessor (sm_90+,
    /// `QUARREL_CUDA_PDL=0` turns it off).
    pdl: bool,
    /// `gdc_kernel_names()`: the kernels that may be launched so.
    gdc: std::collections::HashSet<String>,
    /// `resident_blocks` answers by (kernel, threads, shared memory).
    resident: Mutex<HashMap<(String, u32, u32), usize>>,
    /// The dynamic shared memory each kernel was allowed past 48 KB (`allow_smem`).
    smem_allowed: Mutex<HashMap<String, u32>>,
}

/// `QUARREL_CUDA_CARVEOUT=<0-100>`: every kernel's preferred shared-memory share of the L1 /
/// shared split, in percent (measurements: a multiprocessor changes its split only when idle).
fn carveout() -> Option<i32> {
    std::env::var("QUARREL_CUDA_CARVEOUT").ok().and_then(|v| v.parse().ok()).filter(|c| (0..=100).contains(c))
}

/// A launch held back for fusion with the op that follows (see `CudaBackend`'s ops).
pub(crate) enum Held {
    /// `x += y` (`x += s·y` with `s` set, the product rounded first) over `n` values: a following
    /// RMSNorm of `x` becomes `add_rms_norm` (`add_scaled_rms_norm`).
    Add { x: u64, y: u64, n: u64, s: Option<f32> },
    /// GEMVs over the same Q8 input: up to three become one `gemv3_*` launch.
    Gemv(crate::matmul::GemvGroup),
    /// RoPE of one buffer (the `rope` kernel's arguments, `x2` 0): the RoPE of another buffer
    /// by the same positions and parameters that follows (k after q) joins the launch.
    Rope { args: Vec<Arg>, n: u64 },
    /// RoPE of q and k in one launch (the `rope` kernel's arguments, `x2` set; `n` pairs): a
    /// `kv_store` of that k into an f32/f16 cache that follows joins it (`rope_kv_*`).
    RopeQk { args: Vec<Arg>, n: u64 },
    /// A routed expert GEMV of a decode step: the next one over the same input and routes
    /// (gate after up) joins it (`moe_dev::MoeGemv`).
    Moe(crate::moe_dev::MoeGemv),
    /// A decode step's Mamba2 conv: the scan over its output joins it (`ssm::ConvHeld`).
    SsmConv(crate::ssm::ConvHeld),
    /// A ReLU² in place over `n` values at `x` (Q8 copy at xq / xm where set): a ReLU² of another
    /// buffer that follows (an MoE layer's shared expert after its routed experts) joins it.
    ReluSqr { x: u64, n: u64, xq: u64, xm: u64 },
    /// The weighted combine of device-routed expert rows (`moe_dev::CombHeld`): an `add` of
    /// its output into `x` makes it `CombAdd`.
    Comb(crate::moe_dev::CombHeld),
    /// A combine, then `x += out` (`x += s·out`) over `n` values: a following RMSNorm of `x`
    /// runs all three as `comb_add_(scaled_)rms_norm`.
    CombAdd { c: crate::moe_dev::CombHeld, x: u64, n: u64, s: Option<f32> },
}

/// Debugging switches read once (a lookup per op would cost host time on every decode step):
/// `QUARREL_CUDA_NO_FUSE` (no held-op fusion), `QUARREL_CUDA_NO_FUSED_Q8` (activations quantized
/// by a separate kernel), `QUARREL_CUDA_NO_GEMM` (GEMV for every token count),
/// `QUARREL_CUDA_NO_FUSE2` (RoPE of q/k and the KV store as separate kernels),
/// `QUARREL_CUDA_SKIP=name,prefix,...` (kernels whose names start so are not launched at all:
/// for timing what each kernel costs inside a step; the results are wrong then).
pub(crate) struct Switches {
    pub no_fuse: bool,
    pub no_fuse2: bool,
    pub no_fused_q8: bool,
    pub no_gemm: bool,
    pub skip: Vec<String>,
}

pub(crate) fn switches() -> &'static Switches {
    static S: std::sync::OnceLock<Switches> = std::sync::OnceLock::new();
    S.get_or_init(|| Switches {
        no_fuse: std::env::var_os("QUARREL_CUDA_NO_FUSE").is_some(),
        no_fuse2: std::env::var_os("QUARREL_CUDA_NO_FUSE2").is_some(),
        no_fused_q8: std::env::var_os("QUARREL_CUDA_NO_FUSED_Q8").is_some(),
        no_gemm: std::env::var_os("QUARREL_CUDA_NO_GEMM").is_some(),
        skip: std::env::var("QUARREL_CUDA_SKIP").map(|v| v.split(',').filter(|s| !s.is_empty()).map(String::from).collect()).unwrap_or_default(),
    })
}


impl Device {
    pub fn new(ordinal: usize) -> Result<Device, CudaError> {
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
        let n_sm = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).map_err(drv("multiprocessor count"))?.max(1) as usize;
        let mut modules = Vec::new();
        for (unit, code) in nvrtc::UNITS.iter().zip(nvrtc::compile_all(cc)?) {
            let module = match ctx.load_module(code) {
                Ok(m) => m,
                // a CUBIN the driver cannot take (NVRTC newer than the driver): PTX, JIT-compiled
                Err(_) => ctx.load_module(nvrtc::compile_unit(unit, cc, nvrtc::Target::Ptx)?).map_err(drv("loading a kernel module"))?,
            };
            modules.push(module);
        }
        let mut funcs = HashMap::new();
        for name in kernel_names() {
            let f = modules
                .iter()
                .find_map(|m| m.load_function(&name).ok())
                .ok_or_else(|| CudaError::Driver(format!("kernel {name} is in no compiled unit (src/nvrtc.rs UNITS)")))?;
            if let Some(c) = carveout() {
                f.set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, c).map_err(drv("carveout"))?;
            }
            funcs.insert(name, f);
        }
        let pdl = cc.0 >= 9 && std::env::var("QUARREL_CUDA_PDL").map_or(true, |v| v != "0");
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
            pdl,
            gdc: gdc_kernel_names().into_iter().collect(),
            resident: Mutex::new(HashMap::new()),
            smem_allowed: Mutex::new(HashMap::new()),
        })
    }

    pub fn bind(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(drv("binding the context"))
    }

    pub fn func(&self, name: &str) -> Result<&CudaFunction, CudaError> {
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
        f.set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32).map_err(drv("shared memory attribute"))?;
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

    /// A step of `n` tokens begins (the token embedding): steps of more than a decode step's
    /// tokens are never captured as graphs (`graph::Queue::large_step`).
    pub fn step_tokens(&self, n: usize) {
        if let Ok(mut q) = self.queue.lock() {
            q.large_step = n > crate::matmul::GEMV_MAX_TOKENS;
        }
    }

    /// Run `f` (a library call on the stream, e.g. cuBLAS), its host time counted under `what`
    /// when `QUARREL_CUDA_HOST_TIME` is set.
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
    pub(crate) fn hold(&self, h: Held) -> Result<(), CudaError> {
        self.settle()?;
        *self.held.lock().map_err(|_| CudaError::Driver("lock poisoned".into()))? = Some(h);
        Ok(())
    }

    /// The held launch, if `f` accepts it (else it stays held).
    pub(crate) fn take_held_if(&self, f: impl FnOnce(&Held) -> bool) -> Option<Held> {
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
            Some(Held::Add { x, y, n, s }) => self.launch_add(x, y, n, s),
            Some(Held::Gemv(g)) => g.launch(self),
            Some(Held::Moe(g)) => g.launch(self),
            Some(Held::SsmConv(c)) => c.launch(self),
            Some(Held::ReluSqr { x, n, xq, xm }) => self.launch_1d_now("relu_sqr", n, &[Arg::P(x), Arg::U64(n), Arg::P(xq), Arg::P(xm)]),
            Some(Held::Comb(c)) => c.launch(self),
            Some(Held::CombAdd { c, x, n, s }) => {
                c.launch(self)?;
                self.launch_add(x, c.out, n, s)
            }
            Some(Held::Rope { args, n }) | Some(Held::RopeQk { args, n }) => self.launch_now("rope", (n.div_ceil(256) as u32, 1, 1), 256, 0, &args),
        }
    }

    /// `x += y` (`x += s·y`) over `n` values, queued now.
    pub(crate) fn launch_add(&self, x: u64, y: u64, n: u64, s: Option<f32>) -> Result<(), CudaError> {
        let grid = (n.div_ceil(256) as u32, 1, 1);
        match s {
            None => self.launch_now("add", grid, 256, 0, &[Arg::P(x), Arg::P(y), Arg::U64(n)]),
            Some(s) => self.launch_now("add_scaled", grid, 256, 0, &[Arg::P(x), Arg::P(y), Arg::F(s), Arg::U64(n)]),
        }
    }

    /// Launch `name` on the stream; `args` in the kernel's parameter order.
    pub fn launch(&self, name: &str, grid: (u32, u32, u32), block: u32, smem: u32, args: &[Arg]) -> Result<(), CudaError> {
        self.settle()?;
        self.launch_now(name, grid, block, smem, args)
    }

    /// `launch` without submitting the held launch first.
    pub(crate) fn launch_now(&self, name: &str, grid: (u32, u32, u32), block: u32, smem: u32, args: &[Arg]) -> Result<(), CudaError> {
        let f = self.func(name)?;
        let skip = &switches().skip;
        if !skip.is_empty() && skip.iter().any(|p| name.starts_with(p.as_str())) {
            return Ok(());
        }
        self.allow_smem(name, f, smem)?;
        // every parameter is at most 8 bytes: one little-endian slot each
        let args: Vec<u64> = args.iter().map(|a| a.bits()).collect();
        let pdl = self.pdl && self.gdc.contains(name);
        let rec = crate::graph::Rec { func: f.cu_function() as usize, grid, block, smem, args, pdl };
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
    U(u32),
    U64(u64),
    F(f32),
}

impl Arg {
    /// The parameter slot's bits (every parameter is at most 8 bytes, little-endian).
    pub fn bits(self) -> u64 {
        match self {
            Arg::P(v) | Arg::U64(v) => v,
            Arg::I(v) => v as u32 as u64,
            Arg::U(v) => v as u64,
            Arg::F(v) => v.to_bits() as u64,
        }
    }
}

impl Device {
    /// The name of a loaded kernel function (reports).
    fn func_name(&self, f: usize) -> String {
        self.funcs.iter().find(|(_, func)| func.cu_function() as usize == f).map_or("?".to_string(), |(k, _)| k.clone())
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if let Some(h) = self.queue.lock().ok().and_then(|mut q| q.host.take()) {
            let per = |x: f64| 1e6 * x / h.steps.max(1) as f64;
            eprintln!(
                "\nCUDA host times (QUARREL_CUDA_HOST_TIME), {} steps (downloads), {} segments: recording {:.0} us/step, submitting {:.0} us/step, waiting for the GPU {:.0} us/step",
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
            let mut rows: Vec<(String, f64, u64)> = prof
                .iter()
                .map(|(f, &(ms, n))| {
                    (self.func_name(*f), ms, n)
                })
                .collect();
            rows.sort_by(|a, b| b.1.total_cmp(&a.1));
            let total: f64 = rows.iter().map(|r| r.1).sum();
            let launches: u64 = rows.iter().map(|r| r.2).sum();
            eprintln!("\nCUDA kernel profile (QUARREL_CUDA_PROFILE): {total:.1} ms GPU time, {launches} launches");
            eprintln!("| kernel | ms | launches | us/launch | % |\n|---|---:|---:|---:|---:|");
            for (name, ms, n) in rows.iter().take(40) {
                eprintln!("| {name} | {ms:.2} | {n} | {:.1} | {:.1} |", 1e3 * ms / *n as f64, 100.0 * ms / total.max(1e-9));
            }
        }
    }
}

/// The kernels that begin with `GDC()` (kernels/common.cuh: wait for the previous grid before
/// touching memory) and so may be launched with programmatic stream serialization. A kernel
/// launched so WITHOUT `GDC()` would race the kernel before it: list a new kernel here only
/// if its body starts with `GDC();`.
pub fn gdc_kernel_names() -> Vec<String> {
    let mut v: Vec<String> =
        ["quantize_q8", "zero_fill", "rms_norm", "add_rms_norm", "add_scaled_rms_norm", "comb_add_rms_norm", "comb_add_scaled_rms_norm", "argmax_rows", "sample_rows", "rope", "rope_kv_f32", "rope_kv_f16", "swiglu", "geglu", "add", "add_scaled", "scale", "gather_rows", "attn_combine", "attn_vec_f16", "attn_vec2_f16", "rms_norm_cl", "add_rms_norm_cl", "add_scaled_rms_norm_cl"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for q in ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_K", "q5_K", "q6_K"] {
        for nt in [1, 2, 4, 8] {
            v.push(format!("gemv_{q}_{nt}"));
            v.push(format!("gemv3_{q}_{nt}"));
            v.push(format!("gemv3r_{q}_{nt}"));
        }
        v.push(format!("dequant_{q}"));
        v.push(format!("embed_{q}"));
    }
    for f in ["f32", "f16", "bf16"] {
        for nt in [1, 2, 4, 8] {
            v.push(format!("gemv_{f}_{nt}"));
        }
        v.push(format!("embed_{f}"));
        v.push(format!("tof16_{f}"));
    }
    for k in ["f32", "f16", "q8_0", "q4_0"] {
        v.push(format!("kv_store_{k}"));
        for dpl in [2, 4, 8] {
            v.push(format!("attn_{k}_{dpl}"));
            v.push(format!("attn1_{k}_{dpl}"));
            v.push(format!("attn1g_{k}_{dpl}"));
        }
    }
    // tensor-core prefill attention (attn_mma.cu)
    v.extend(crate::attn::mma_kernel_names());
    // MoE and Mamba2 decode kernels (moe.cu, ssm.cu)
    v.extend(crate::moe::gdc_kernel_names());
    v.extend(crate::moe_dev::gdc_kernel_names());
    v.extend(crate::ssm::gdc_kernel_names());
    // the GEMVs in the CPU's float order
    v.extend(crate::exact::kernel_names());
    // the GEMVs in MMQ's float order
    v.extend(crate::invariant::kernel_names());
    v
}

/// Every kernel the module exports (looked up once at start-up): `gdc_kernel_names()` and the
/// kernels without `GDC()` (launched the plain way).
pub fn kernel_names() -> Vec<String> {
    // MMQ, MoE and SSM kernels do not begin with GDC(): launched in plain stream order
    let mut v = gdc_kernel_names();
    v.extend(crate::mmq::kernel_names());
    v.extend(crate::batch::kernel_names());
    v.extend(crate::moe::kernel_names());
    v.extend(crate::moe_dev::kernel_names());
    v.extend(crate::moe_chunk::kernel_names());
    v.extend(crate::ssm::kernel_names());
    v
}
