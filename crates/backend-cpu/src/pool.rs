//! `SpinPool`: a persistent worker pool for the per-op parallel loops of a decode step.
//!
//! A decode step runs a few hundred short parallel ops; waking sleeping threads for each one
//! costs more than the op. Here the calling thread takes part in the work, workers spin on a
//! generation counter for about a millisecond after each op (so back-to-back ops start at
//! once), then sleep on a condvar (so an idle engine burns no CPU).
//!
//! Per op, `run` publishes the job and bumps the generation (release); workers see the new
//! generation (acquire), *join* it, take tasks, and count themselves out. No lock is taken
//! unless a worker sleeps.
//!
//! Tasks are split into one contiguous range per thread, each with its own counter: a thread
//! takes its own range's tasks in order, then helps with the others' (from their counters,
//! so every task still runs exactly once). A thread thus walks neighbouring tasks (a GEMM's
//! neighbouring weight panels: one stream the hardware prefetchers and the tiles' "next
//! panel" prefetch follow across task boundaries, where tasks dealt alternately from one
//! shared counter started every task cold), and the counters' cache lines stay with their
//! owners instead of bouncing between the cores on every task.
//!
//! The caller never waits for a worker that has not started: after its own last task it
//! closes the generation (a worker that has not joined by then skips it) and waits only for
//! the workers that joined. On a machine with more runnable threads than cores a worker is
//! often off its core when a job is published; the caller then runs the tasks itself instead
//! of waiting a scheduler time slice for it.

use std::cell::UnsafeCell;
use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst},
};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

type Job = *const (dyn Fn(usize) + Sync);

/// A value alone on its cache lines (128 bytes: the adjacent-line prefetcher pairs lines), so
/// that the counters the caller and the workers write do not invalidate each other's reads.
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

struct Shared {
    generation: Padded<AtomicU64>,
    /// The current job: written by `run` only while no worker is in a generation (all
    /// counted out of the last one), read by workers after they see the new generation.
    job: UnsafeCell<Option<SendJob>>,
    n_tasks: AtomicUsize,
    /// Per thread (caller first): the next task of its range (see the module doc).
    next: Box<[Padded<AtomicUsize>]>,
    /// `(generation as u32) << 32 | CLOSED | workers in it`: who joined the current
    /// generation, and whether it still takes workers.
    joined: Padded<AtomicU64>,
    sleeping: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    stop: Padded<AtomicBool>,
    /// `QUARREL_CPU_PROFILE` counters (None: off).
    prof: Option<Box<Prof>>,
    /// When the current generation was published (profiling only).
    started: UnsafeCell<Option<Instant>>,
}

/// Where a pool's time goes (`QUARREL_CPU_PROFILE=1`): runs, the caller's own task time, its
/// wait for the workers after its last task, the workers' task time and their start latency
/// (publish -> first task). Nanoseconds, summed over runs (and workers).
#[derive(Default)]
struct Prof {
    runs: AtomicU64,
    tasks: AtomicU64,
    caller_work: AtomicU64,
    caller_wait: AtomicU64,
    worker_work: AtomicU64,
    worker_start: AtomicU64,
    /// Task time as thread CPU time (what preemption on a busy machine does not inflate).
    caller_cpu: AtomicU64,
    worker_cpu: AtomicU64,
}

/// A snapshot of a pool's profile counters (all zero unless `QUARREL_CPU_PROFILE` was set
/// when the pool was made).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Parallel regions run (calls of `run` with 2+ tasks and a worker).
    pub runs: u64,
    pub tasks: u64,
    /// The calling thread's time in tasks, and waiting for the workers after its last task.
    pub caller_work_ns: u64,
    pub caller_wait_ns: u64,
    /// The workers' time in tasks, and from a region's publication to their first task.
    pub worker_work_ns: u64,
    pub worker_start_ns: u64,
    /// The caller's and the workers' task time as thread CPU time.
    pub caller_cpu_ns: u64,
    pub worker_cpu_ns: u64,
}

#[derive(Clone, Copy)]
struct SendJob(Job);
// SAFETY: the job is only dereferenced while `run` (which owns the borrow) waits for it.
unsafe impl Send for SendJob {}
// SAFETY: `job` is written only between generations (see its doc); everything else is atomic
// or locked.
unsafe impl Sync for Shared {}

pub struct SpinPool {
    shared: Arc<Shared>,
    workers: Vec<std::thread::JoinHandle<()>>,
    /// Serializes `run` calls from different threads.
    running: Mutex<()>,
}

/// The `joined` bit saying that the generation takes no more workers.
const CLOSED: u64 = 1 << 31;
const COUNT: u64 = CLOSED - 1;

/// Wait iterations (spins, then yields) before a worker goes to sleep.
const SPINS: u32 = 1 << 12;

impl SpinPool {
    /// A pool of `n_threads` including the caller (so `n_threads - 1` workers).
    pub fn new(n_threads: usize) -> SpinPool {
        keep_freed_pages();
        let shared = Arc::new(Shared {
            generation: Padded(AtomicU64::new(0)),
            job: UnsafeCell::new(None),
            n_tasks: AtomicUsize::new(0),
            next: (0..n_threads.max(1)).map(|_| Padded(AtomicUsize::new(0))).collect(),
            joined: Padded(AtomicU64::new(CLOSED)),
            sleeping: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            stop: Padded(AtomicBool::new(false)),
            prof: crate::tuning::get().profile.then(Box::default),
            started: UnsafeCell::new(None),
        });
        let workers = (1..n_threads.max(1))
            .map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("quarrel-spin-{i}"))
                    .spawn(move || worker(&s, i))
                    .expect("spawning a worker thread")
            })
            .collect();
        SpinPool { shared, workers, running: Mutex::new(()) }
    }

    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// The profile counters so far (see [`PoolStats`]).
    pub fn stats(&self) -> PoolStats {
        let Some(p) = self.shared.prof.as_deref() else { return PoolStats::default() };
        PoolStats {
            runs: p.runs.load(Relaxed),
            tasks: p.tasks.load(Relaxed),
            caller_work_ns: p.caller_work.load(Relaxed),
            caller_wait_ns: p.caller_wait.load(Relaxed),
            worker_work_ns: p.worker_work.load(Relaxed),
            worker_start_ns: p.worker_start.load(Relaxed),
            caller_cpu_ns: p.caller_cpu.load(Relaxed),
            worker_cpu_ns: p.worker_cpu.load(Relaxed),
        }
    }

    /// Run `f(0..n_tasks)` on the caller and the workers; returns when all tasks are done.
    pub fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() || n_tasks <= 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        let _guard = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let s = &self.shared;
        // SAFETY: the lifetime is erased only for the duration of this call: we wait below
        // until every worker that joined this generation has finished before `f` goes out of
        // scope (the others never read it).
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f) };
        // SAFETY: the last generation is closed and every worker that joined it counted
        // itself out (acquired below), so none reads `job` until it joins this one.
        unsafe { *s.job.get() = Some(SendJob(job)) };
        for (k, c) in s.next.iter().enumerate() {
            c.store(range(k, s.next.len(), n_tasks).start, Relaxed);
        }
        s.n_tasks.store(n_tasks, Relaxed);
        // open: tagged with the generation about to be published, nobody in it
        let gen = s.generation.load(Relaxed).wrapping_add(1);
        s.joined.store((gen & 0xFFFF_FFFF) << 32, Release);
        let t0 = s.prof.as_ref().map(|_| Instant::now());
        // SAFETY: as `job`: no worker reads it before the generation bump below.
        unsafe { *s.started.get() = t0 };
        // SeqCst: ordered before the `sleeping` load (a worker going to sleep increments
        // `sleeping`, then re-checks the generation under the lock)
        s.generation.fetch_add(1, SeqCst);
        if s.sleeping.load(SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let c0 = t0.map(|_| thread_cpu_time());
        drain(s, 0, f);
        let t1 = t0.map(|_| Instant::now());
        if let (Some(p), Some(c0)) = (s.prof.as_deref(), c0) {
            p.caller_cpu.fetch_add((thread_cpu_time() - c0).as_nanos() as u64, Relaxed);
        }
        // no more joiners; wait for those in it
        s.joined.fetch_or(CLOSED, AcqRel);
        let mut spins = 0u32;
        while s.joined.load(Acquire) & COUNT != 0 {
            backoff(&mut spins);
        }
        if let (Some(p), Some(t0), Some(t1)) = (s.prof.as_deref(), t0, t1) {
            p.runs.fetch_add(1, Relaxed);
            p.tasks.fetch_add(n_tasks as u64, Relaxed);
            p.caller_work.fetch_add((t1 - t0).as_nanos() as u64, Relaxed);
            p.caller_wait.fetch_add(t1.elapsed().as_nanos() as u64, Relaxed);
        }
        // SAFETY: as above (the generation is closed and every worker in it is out).
        unsafe { *s.job.get() = None };
    }
}

/// The calling thread's CPU time (Linux `CLOCK_THREAD_CPUTIME_ID`; elsewhere wall time since
/// the first call): for profiles on a busy machine, where wall time counts other processes.
pub fn thread_cpu_time() -> std::time::Duration {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a valid clock id and out pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }
    #[cfg(not(target_os = "linux"))]
    {
        static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        T0.get_or_init(Instant::now).elapsed()
    }
}

/// Spin briefly, then yield the core: on an oversubscribed machine a waiting thread must not
/// keep the thread it waits for off the CPU.
#[inline]
fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 256 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// Thread `k`'s range of `n` tasks over `t` threads.
fn range(k: usize, t: usize, n: usize) -> std::ops::Range<usize> {
    k * n / t..(k + 1) * n / t
}

/// Thread `me`'s own range first, then the others' remaining tasks.
fn drain(s: &Shared, me: usize, f: &(dyn Fn(usize) + Sync)) {
    let (n, t) = (s.n_tasks.load(Relaxed), s.next.len());
    for r in 0..t {
        let k = (me + r) % t;
        let end = range(k, t, n).end;
        loop {
            let i = s.next[k].fetch_add(1, Relaxed);
            if i >= end {
                break;
            }
            f(i);
        }
    }
}

fn worker(s: &Shared, me: usize) {
    let mut seen = 0u64;
    loop {
        // wait for a new generation: spin, then sleep
        let mut spins = 0;
        loop {
            if s.stop.load(Relaxed) {
                return;
            }
            let g = s.generation.load(Acquire);
            if g != seen {
                seen = g;
                break;
            }
            if spins < SPINS {
                backoff(&mut spins);
                continue;
            }
            let l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleeping.fetch_add(1, SeqCst);
            if s.generation.load(SeqCst) == seen && !s.stop.load(SeqCst) {
                drop(s.wake.wait(l).unwrap_or_else(|e| e.into_inner()));
            }
            s.sleeping.fetch_sub(1, SeqCst);
            spins = 0;
        }
        if !join(s, seen) {
            continue; // closed (or already over) before this worker got to it
        }
        // SAFETY: `run` wrote `job` before the generation bump we acquired, and does not write
        // it again until we, having joined, count ourselves out below.
        let job = unsafe { *s.job.get() };
        if let Some(SendJob(j)) = job {
            // SAFETY: written before the generation bump, like `job`.
            let t0 = unsafe { *s.started.get() };
            let t1 = t0.map(|_| Instant::now());
            let c0 = t0.map(|_| thread_cpu_time());
            // SAFETY: `run` keeps the closure alive until every worker that joined is out.
            drain(s, me, unsafe { &*j });
            if let (Some(p), Some(t0), Some(t1), Some(c0)) = (s.prof.as_deref(), t0, t1, c0) {
                p.worker_start.fetch_add((t1 - t0).as_nanos() as u64, Relaxed);
                p.worker_work.fetch_add(t1.elapsed().as_nanos() as u64, Relaxed);
                p.worker_cpu.fetch_add((thread_cpu_time() - c0).as_nanos() as u64, Relaxed);
            }
        }
        s.joined.fetch_sub(1, AcqRel);
    }
}

/// Join generation `gen` unless it is closed or over: true when this worker may run its tasks
/// (and must then count itself out of `joined`).
fn join(s: &Shared, gen: u64) -> bool {
    let tag = (gen & 0xFFFF_FFFF) << 32;
    let mut cur = s.joined.load(Acquire);
    loop {
        if cur & !(CLOSED | COUNT) != tag || cur & CLOSED != 0 {
            return false;
        }
        match s.joined.compare_exchange_weak(cur, cur + 1, AcqRel, Acquire) {
            Ok(_) => return true,
            Err(now) => cur = now,
        }
    }
}

impl Drop for SpinPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        {
            let _l = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Per-step buffers (activations, logits: up to a few MiB each) are allocated and freed on
/// every forward pass. glibc serves large ones with fresh mmaps, or trims the heap top after
/// they are freed, so every step page-faults its buffers in again (zeroing each page). Keep
/// freed memory below 64 MiB in the heap instead (the KV cache and other big, long-lived
/// buffers still get their own mappings).
fn keep_freed_pages() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: mallopt only changes allocator tunables; called once, before our buffers.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
                libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_exactly_once() {
        // per-thread ranges: fewer tasks than threads, uneven splits, stealing
        for threads in 1..6 {
            let p = SpinPool::new(threads);
            for n in [0usize, 1, 2, 3, 4, 5, 7, 13, 100, 1000] {
                let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                p.run(n, &|i| {
                    hits[i].fetch_add(1, SeqCst);
                });
                assert!(hits.iter().all(|h| h.load(SeqCst) == 1), "threads {threads}, n {n}");
            }
        }
    }

    #[test]
    fn back_to_back_small_runs_lose_and_repeat_no_task() {
        // workers join late, skip closed generations and race the next one's publication
        for threads in 2..5 {
            let p = SpinPool::new(threads);
            let total = AtomicU32::new(0);
            let mut want = 0;
            for i in 0..10_000usize {
                let n = 2 + i % 5;
                want += n as u32;
                let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                p.run(n, &|k| {
                    hits[k].fetch_add(1, SeqCst);
                    total.fetch_add(1, SeqCst);
                    // every other run's tasks take a few microseconds: workers join those
                    if i % 2 == 1 {
                        let t = std::time::Instant::now();
                        while t.elapsed() < std::time::Duration::from_micros(2) {
                            std::hint::spin_loop();
                        }
                    }
                });
                assert!(hits.iter().all(|h| h.load(SeqCst) == 1), "threads {threads}, run {i}");
            }
            assert_eq!(total.load(SeqCst), want);
        }
    }

    #[test]
    fn works_after_workers_fell_asleep() {
        let p = SpinPool::new(2);
        let c = AtomicU32::new(0);
        p.run(10, &|_| {
            c.fetch_add(1, SeqCst);
        });
        std::thread::sleep(std::time::Duration::from_millis(30));
        p.run(10, &|_| {
            c.fetch_add(1, SeqCst);
        });
        assert_eq!(c.load(SeqCst), 20);
    }
}
