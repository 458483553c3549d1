//! The launch queue: kernels are recorded as the model calls ops and submitted in segments of
//! `segment` launches (and at the next synchronization point, a download), so that the GPU runs
//! the start of a step while the host still records the rest of it. A segment that repeats
//! exactly (same kernels, grids and arguments: decode steps do, thanks to the pool's
//! deterministic addresses and the device-side batch arrays) is captured once as a CUDA graph
//! and replayed with one launch afterwards.

use crate::error::{drv, CudaError};
use crate::tuning::Profile;
use cudarc::driver::{result, sys, CudaGraph, CudaStream};
use std::sync::Arc;

/// One recorded kernel launch.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Rec {
    pub func: usize,
    pub grid: (u32, u32, u32),
    pub block: u32,
    pub smem: u32,
    pub args: Vec<u64>,
    /// Launched with programmatic stream serialization (the kernel waits for its predecessor
    /// itself: `GDC()` in kernels/common.cuh).
    pub pdl: bool,
}

/// Graphs kept (a step is several segments; a few step shapes alternate, e.g. batch sizes of
/// the service).
const MAX_GRAPHS: usize = 192;
/// Launches per submitted segment. Small
/// enough that the GPU starts early, large enough that the gaps between graph launches stay few.
const SEGMENT: usize = 48;
/// Shorter queues are launched directly.
const MIN_GRAPH_LAUNCHES: usize = 16;

/// A graph owned by the queue.
struct Graph(CudaGraph);
// SAFETY: graph handles may be launched and destroyed from any thread of the context; the
// queue is only touched under the device's mutex.
unsafe impl Send for Graph {}

pub struct Queue {
    recs: Vec<Rec>,
    /// Whether the queued step may become a graph.
    pub graphable: bool,
    /// Segments seen once (captured when they come again), with their hashes.
    seen: Vec<(u64, Vec<Rec>)>,
    graphs: Vec<(u64, Vec<Rec>, Graph)>,
    /// Submit once this many launches are queued.
    pub segment: usize,
    /// The GPU waits for us (set after a download's synchronization): the next segment is cut
    /// shorter so that the GPU starts sooner.
    pub idle: bool,
    disabled: bool,
    /// The step being recorded has more tokens than a decode step (`Device::step_begins`): its
    /// segments are launched directly, never captured: a prompt's steps rarely repeat, so
    /// capturing them costs the capture and gains nothing.
    pub large_step: bool,
    /// `QUARREL_CUDA_PROFILE=kernels`: GPU time and launches per kernel (no graphs then).
    pub profile: Option<std::collections::HashMap<usize, (f64, u64)>>,
    /// `QUARREL_CUDA_PROFILE=host`: where a step's wall time goes on the host.
    pub host: Option<HostTimes>,
    first: Option<std::time::Instant>,
}

/// Host-side step times (seconds, summed): recording (first launch to submit), submitting
/// (graph lookup and launch), waiting for the GPU in downloads (`steps`: downloads).
#[derive(Default, Debug)]
pub struct HostTimes {
    pub steps: u64,
    pub segments: u64,
    pub record: f64,
    pub submit: f64,
    pub wait: f64,
    /// Host time before each kernel's launches (since the launch before it, downloads
    /// excluded): seconds and launches by function; where the recording time goes.
    pub before: std::collections::HashMap<usize, (f64, u64)>,
    /// The last queued launch (None after a download).
    pub last: Option<std::time::Instant>,
    /// Library calls (`Device::timed`): seconds and calls by name.
    pub calls: std::collections::HashMap<&'static str, (f64, u64)>,
}

impl Default for Queue {
    fn default() -> Self {
        let t = crate::tuning::get();
        let profile = (t.profile == Profile::Kernels).then(Default::default);
        let disabled = !t.graphs || profile.is_some();
        let host = (t.profile == Profile::Host).then(HostTimes::default);
        Queue {
            recs: Vec::new(),
            graphable: true,
            seen: Vec::new(),
            graphs: Vec::new(),
            segment: SEGMENT,
            idle: true,
            disabled,
            large_step: false,
            profile,
            host,
            first: None,
        }
    }
}

impl Queue {
    /// Queue a launch; true when a segment is full (the caller submits it).
    pub fn push(&mut self, r: Rec) -> bool {
        if let Some(h) = self.host.as_mut() {
            let now = std::time::Instant::now();
            if self.recs.is_empty() {
                self.first = Some(now);
            }
            if let Some(last) = h.last.replace(now) {
                let e = h.before.entry(r.func).or_default();
                e.0 += (now - last).as_secs_f64();
                e.1 += 1;
            }
        }
        self.recs.push(r);
        let limit = if self.idle { (self.segment / 3).max(MIN_GRAPH_LAUNCHES) } else { self.segment };
        self.segment > 0 && self.recs.len() >= limit
    }

    fn launch_direct(recs: &[Rec], stream: &CudaStream) -> Result<(), CudaError> {
        for r in recs {
            let mut slots = r.args.clone();
            let mut ptrs: Vec<*mut std::ffi::c_void> = slots.iter_mut().map(|s| s as *mut u64 as *mut std::ffi::c_void).collect();
            if r.pdl {
                Self::launch_pdl(r, stream, &mut ptrs)?;
                continue;
            }
            // SAFETY: the record holds a function of the loaded module and its arguments.
            unsafe { result::launch_kernel(r.func as sys::CUfunction, r.grid, (r.block, 1, 1), r.smem, stream.cu_stream(), &mut ptrs) }
                .map_err(|e| CudaError::Driver(format!("kernel launch: {e:?}")))?;
        }
        Ok(())
    }

    /// `cuLaunchKernelEx` with the programmatic-stream-serialization attribute.
    fn launch_pdl(r: &Rec, stream: &CudaStream, ptrs: &mut [*mut std::ffi::c_void]) -> Result<(), CudaError> {
        // SAFETY: a zeroed attribute is a valid bit pattern (a C struct of integers and a union).
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let cfg = sys::CUlaunchConfig {
            gridDimX: r.grid.0,
            gridDimY: r.grid.1,
            gridDimZ: r.grid.2,
            blockDimX: r.block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: r.smem,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: the record holds a function of the loaded module and its arguments; cfg and
        // attr outlive the call.
        unsafe { sys::cuLaunchKernelEx(&cfg, r.func as sys::CUfunction, ptrs.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .map_err(|e| CudaError::Driver(format!("kernel launch (PDL): {e:?}")))
    }

    fn launch_timed(
        recs: &[Rec],
        stream: &Arc<CudaStream>,
        prof: &mut std::collections::HashMap<usize, (f64, u64)>,
    ) -> Result<(), CudaError> {
        let ctx = stream.context();
        let mut evs = Vec::with_capacity(recs.len() + 1);
        let ev = || ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(drv("event"));
        let first = ev()?;
        first.record(stream).map_err(drv("event"))?;
        for r in recs {
            Self::launch_direct(std::slice::from_ref(r), stream)?;
            let e = ev()?;
            e.record(stream).map_err(drv("event"))?;
            evs.push(e);
        }
        stream.synchronize().map_err(drv("synchronize"))?;
        let mut prev = &first;
        for (r, e) in recs.iter().zip(&evs) {
            let ms = prev.elapsed_ms(e).map_err(drv("event"))? as f64;
            let slot = prof.entry(r.func).or_default();
            slot.0 += ms;
            slot.1 += 1;
            prev = e;
        }
        Ok(())
    }

    fn capture(recs: &[Rec], stream: &Arc<CudaStream>) -> Result<Option<CudaGraph>, CudaError> {
        stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).map_err(drv("begin capture"))?;
        let launched = Self::launch_direct(recs, stream);
        let g = stream
            .end_capture(sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
            .map_err(drv("end capture"))?;
        launched?;
        Ok(g)
    }

    /// Submit the queued launches to `stream`.
    pub fn submit(&mut self, stream: &Arc<CudaStream>) -> Result<(), CudaError> {
        let Some(first) = self.first.take() else { return self.submit_inner(stream) };
        let t = std::time::Instant::now();
        let r = self.submit_inner(stream);
        if let Some(h) = self.host.as_mut() {
            h.segments += 1;
            h.record += (t - first).as_secs_f64();
            h.submit += t.elapsed().as_secs_f64();
        }
        r
    }

    fn submit_inner(&mut self, stream: &Arc<CudaStream>) -> Result<(), CudaError> {
        let recs = std::mem::take(&mut self.recs);
        self.idle &= recs.is_empty();
        let graphable =
            std::mem::replace(&mut self.graphable, true) && !self.disabled && recs.len() >= MIN_GRAPH_LAUNCHES && !self.large_step;
        if recs.is_empty() {
            return Ok(());
        }
        if let Some(prof) = self.profile.as_mut() {
            return Self::launch_timed(&recs, stream, prof);
        }
        if !graphable {
            return Self::launch_direct(&recs, stream);
        }
        let hash = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            recs.hash(&mut h);
            h.finish()
        };
        if let Some(i) = self.graphs.iter().position(|(h, k, _)| *h == hash && *k == recs) {
            let entry = self.graphs.remove(i);
            entry.2 .0.launch().map_err(drv("graph launch"))?;
            self.graphs.insert(0, entry);
            return Ok(());
        }
        if let Some(i) = self.seen.iter().position(|(h, k)| *h == hash && *k == recs) {
            self.seen.remove(i);
            match Self::capture(&recs, stream) {
                Ok(Some(g)) => {
                    g.launch().map_err(drv("graph launch"))?;
                    self.graphs.insert(0, (hash, recs, Graph(g)));
                    self.graphs.truncate(MAX_GRAPHS);
                    return Ok(());
                }
                // capture not possible here: stop trying
                r => {
                    let why = match r {
                        Err(e) => e.to_string(),
                        _ => "no graph returned".into(),
                    };
                    eprintln!("quarrel-cuda: CUDA graph capture failed ({why}); launching kernels one by one from now on");
                    self.disabled = true;
                    return Self::launch_direct(&recs, stream);
                }
            }
        }
        Self::launch_direct(&recs, stream)?;
        self.seen.insert(0, (hash, recs));
        self.seen.truncate(MAX_GRAPHS);
        Ok(())
    }
}
