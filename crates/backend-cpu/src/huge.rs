//! Buffers on transparent huge pages, for what a decode step streams every step: the kept
//! GEMM panels / repacked weights and the paged K/V cache.
//!
//! With 4 KiB pages every 4 KiB of a stream is a TLB miss, and under a hypervisor every miss
//! is a two-dimensional page walk: attention over a cache of scattered 16-position blocks
//! (one page each) measured 19.4 ns per head-position on 4 KiB pages and 13.3 ns on 2 MiB
//! pages (`examples/attn_pool.rs`, 16 sequences x 192 positions x 30 layers, one thread).
//! `MADV_HUGEPAGE` must be given before the first touch (the kernel backs a region with huge
//! pages at its first page fault), so buffers come zeroed from a fresh anonymous mapping,
//! 2 MiB-aligned, advised at once, and only then filled.
//!
//! Small buffers share 32 MiB chunks ([`Arena`]): a chunk lives while any region of it does,
//! and untouched parts of a chunk stay unbacked. `QUARREL_HUGE_PAGES=0`: plain 4 KiB
//! pages (the same mappings without the advice).

use std::sync::{Arc, Mutex};

const HUGE: usize = 2 << 20;
/// Arena chunk size, and the largest region that shares a chunk (larger ones get their own).
const CHUNK: usize = 32 << 20;
const SHARED_MAX: usize = CHUNK / 4;

/// Zeroed, 2 MiB-aligned memory (64-byte-aligned and page-backed everywhere).
struct Mapping {
    ptr: *mut u8,
    size: usize,
    #[cfg(target_os = "linux")]
    base: *mut libc::c_void,
    #[cfg(target_os = "linux")]
    map_len: usize,
    #[cfg(not(target_os = "linux"))]
    layout: std::alloc::Layout,
}

// SAFETY: a plain owned allocation; who may write where is the owners' business (regions).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

fn huge_pages_wanted() -> bool {
    crate::tuning::get().huge_pages
}

impl Mapping {
    /// `size` zero bytes (at least one page). None only if the system is out of memory.
    fn new(size: usize) -> Option<Mapping> {
        let size = size.max(1);
        #[cfg(target_os = "linux")]
        {
            let rounded = size.next_multiple_of(HUGE);
            let map_len = rounded + HUGE;
            // SAFETY: a fresh private anonymous mapping (zero-filled), checked below.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    map_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                return None;
            }
            let ptr = (base as usize).next_multiple_of(HUGE) as *mut u8;
            if huge_pages_wanted() {
                // SAFETY: [ptr, ptr + rounded) lies inside the mapping; advice changes no
                // contents (a kernel without THP ignores it).
                unsafe { libc::madvise(ptr as *mut libc::c_void, rounded, libc::MADV_HUGEPAGE) };
            }
            Some(Mapping { ptr, size, base, map_len })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let layout = std::alloc::Layout::from_size_align(size, 4096).ok()?;
            // SAFETY: a nonzero size.
            let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
            (!ptr.is_null()).then_some(Mapping { ptr, size, layout })
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe {
            libc::munmap(self.base, self.map_len);
        }
        #[cfg(not(target_os = "linux"))]
        // SAFETY: allocated in `new` with this layout.
        unsafe {
            std::alloc::dealloc(self.ptr, self.layout)
        }
    }
}

/// Hands out zeroed, 64-byte-aligned regions of shared huge-page chunks.
pub(crate) struct Arena {
    cur: Mutex<Option<(Arc<Mapping>, usize)>>,
}

/// Where kept weight panels and repacked weights live.
pub(crate) static WEIGHTS: Arena = Arena::new();
/// Where K/V cache stores live.
pub(crate) static KV: Arena = Arena::new();

impl Arena {
    pub(crate) const fn new() -> Arena {
        Arena { cur: Mutex::new(None) }
    }

    /// `len` zero bytes: a region of the current chunk when small, else a mapping of its own.
    pub(crate) fn alloc(&self, len: usize) -> Option<Region> {
        let need = len.next_multiple_of(64).max(64);
        if need > SHARED_MAX {
            return Some(Region { map: Arc::new(Mapping::new(need)?), off: 0, len });
        }
        let mut cur = self.cur.lock().unwrap_or_else(|e| e.into_inner());
        if cur.as_ref().is_none_or(|(m, used)| used + need > m.size) {
            *cur = Some((Arc::new(Mapping::new(CHUNK)?), 0));
        }
        let (m, used) = cur.as_mut().expect("set above");
        let r = Region { map: Arc::clone(m), off: *used, len };
        *used += need;
        Some(r)
    }
}

/// `len` bytes of an [`Arena`] chunk, owned alone (regions never overlap).
pub(crate) struct Region {
    map: Arc<Mapping>,
    off: usize,
    len: usize,
}

impl Region {
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: [off, off + len) lies inside the mapping and belongs to this region alone.
        unsafe { std::slice::from_raw_parts(self.map.ptr.add(self.off), self.len) }
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `bytes`; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.map.ptr.add(self.off), self.len) }
    }
}

impl std::ops::Deref for Region {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.bytes()
    }
}

/// Element types whose all-zero bytes are the value zero (fresh mappings are zero-filled).
///
/// # Safety
/// All-zero bytes must be a valid value of the type, and it must have no padding.
pub(crate) unsafe trait ZeroBits: Copy {}
// SAFETY: plain numbers; zero bytes are 0 / +0.0.
unsafe impl ZeroBits for u8 {}
// SAFETY: as above.
unsafe impl ZeroBits for f32 {}
// SAFETY: as above.
unsafe impl ZeroBits for half::f16 {}

/// A zero-initialized `[T]` in an [`Arena`] (`Vec`-like, fixed length).
pub(crate) struct HugeVec<T: ZeroBits> {
    region: Option<Region>,
    fallback: Vec<T>,
    len: usize,
}

impl<T: ZeroBits> HugeVec<T> {
    /// `n` zeros in `arena` (a plain vector if the mapping fails).
    pub(crate) fn zeroed(arena: &Arena, n: usize) -> HugeVec<T> {
        let bytes = n * std::mem::size_of::<T>();
        match arena.alloc(bytes) {
            Some(region) => HugeVec { region: Some(region), fallback: Vec::new(), len: n },
            // SAFETY: `ZeroBits`: all-zero bytes are a valid T.
            None => HugeVec { region: None, fallback: vec![unsafe { std::mem::zeroed() }; n], len: n },
        }
    }
}

impl<T: ZeroBits> std::ops::Deref for HugeVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.region {
            // SAFETY: the region holds len * size_of::<T>() bytes, 64-byte aligned, all valid
            // T (`ZeroBits`, and only T values are ever written through `deref_mut`).
            Some(r) => unsafe { std::slice::from_raw_parts(r.bytes().as_ptr() as *const T, self.len) },
            None => &self.fallback,
        }
    }
}

impl<T: ZeroBits> std::ops::DerefMut for HugeVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let len = self.len;
        match &mut self.region {
            // SAFETY: as `deref`, exclusive through `&mut self`.
            Some(r) => unsafe { std::slice::from_raw_parts_mut(r.bytes_mut().as_mut_ptr() as *mut T, len) },
            None => &mut self.fallback,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_zeroed_aligned_and_disjoint() {
        let arena = Arena::new();
        let mut rs: Vec<Region> =
            [1usize, 100, 4096, 70_000, SHARED_MAX + 5, 3].iter().map(|&n| arena.alloc(n).expect("mapping")).collect();
        for (i, r) in rs.iter_mut().enumerate() {
            assert_eq!(r.bytes().as_ptr() as usize % 64, 0);
            assert!(r.bytes().iter().all(|&b| b == 0));
            r.bytes_mut().fill(i as u8 + 1);
        }
        for (i, r) in rs.iter().enumerate() {
            assert!(r.bytes().iter().all(|&b| b == i as u8 + 1), "region {i} overwritten");
        }
        // a chunk outlives the arena's reference to it while regions hold it
        drop(arena);
        assert_eq!(rs[1][99], 2);
    }

    #[test]
    fn huge_vec_reads_back_what_was_written() {
        let mut v: HugeVec<half::f16> = HugeVec::zeroed(&KV, 3 << 20);
        assert!(v.iter().all(|x| x.to_bits() == 0));
        v[12345] = half::f16::from_f32(1.5);
        let last = v.len() - 1;
        v[last] = half::f16::from_f32(-2.0);
        assert_eq!((v[12345].to_f32(), v[last].to_f32(), v.len()), (1.5, -2.0, 3 << 20));
    }
}
