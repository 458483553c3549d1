//! Attention inner loops: one query head over a run of cached positions, folded into an
//! online softmax. Each kernel has a plain reference twin here (`*_ref`), and the SIMD kernels
//! (x86 AVX2+FMA+F16C) give the same bits (`tests/attn_vs_reference.rs`).
//!
//! ```text
//!  q (head_dim)   K/V rows k[start + j*stride ..][..head_dim], j in 0..len
//!    score_j = q·k_j * scale (softcap)  ──►  m, s, acc  (running max, sum, weighted V)
//! ```
//!
//! Two numeric flavours, after llama.cpp's CPU flash attention:
//! - [`vec_f16_run`]: its "vector" path (decode over an f16 cache): q already rounded to f16,
//!   scores by `ggml_vec_dot_f16`'s AVX-512 order, the V accumulator rounded to f16 after every
//!   update (`ggml_vec_scale_f16` / `ggml_vec_mad_f16`: f32 FMA, f16 storage).
//! - [`f32_run`]: all f32 (prompt batches): 8-lane dot, plain mul/add updates.

use half::f16;

/// Running state of one head's online softmax (the accumulator lives beside it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Online {
    /// Largest score so far.
    pub m: f32,
    /// Sum of `exp(score - m)`.
    pub s: f32,
}

impl Online {
    pub const START: Online = Online { m: f32::NEG_INFINITY, s: 0.0 };
}

/// Cached K or V values of one layer.
#[derive(Clone, Copy)]
pub enum KvRows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl KvRows<'_> {
    pub fn len(&self) -> usize {
        match self {
            KvRows::F32(v) => v.len(),
            KvRows::F16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    fn at(&self, i: usize) -> f32 {
        match self {
            KvRows::F32(v) => v[i],
            KvRows::F16(v) => v[i].to_f32(),
        }
    }
}

/// A run of `len` cached positions: position `j`'s row starts at element `start + j * stride`.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    pub start: usize,
    pub stride: usize,
    pub len: usize,
}

/// Score scaling: `score = softcap(q·k * scale)`.
#[derive(Clone, Copy, Debug)]
pub struct Scoring {
    pub scale: f32,
    pub softcap: Option<f32>,
}

impl Scoring {
    #[inline]
    pub(crate) fn apply(&self, dot: f32) -> f32 {
        let score = dot * self.scale;
        match self.softcap {
            Some(c) => c * (score / c).tanh(),
            None => score,
        }
    }
}

/// Panic unless every row of `run` (of `hd` elements) lies within `n` elements.
#[track_caller]
pub(crate) fn check_run(run: &Run, hd: usize, n: usize) {
    if run.len > 0 {
        let end = (run.len - 1).checked_mul(run.stride).and_then(|x| x.checked_add(run.start)).and_then(|x| x.checked_add(hd));
        assert!(end.is_some_and(|e| e <= n), "attention run {run:?} of {hd} past {n} cached values");
    }
}

/// The checks of one query's run (head dim a multiple of `lanes`) over rows of `k_len` /
/// `v_len` values: the head dim.
#[track_caller]
pub(crate) fn run_args(q: &[f32], lanes: usize, (k_len, v_len): (usize, usize), run: &Run, acc: &[f32]) -> usize {
    let hd = q.len();
    assert!(hd.is_multiple_of(lanes) && acc.len() == hd, "attention run: query of {hd}, accumulator of {}", acc.len());
    check_run(run, hd, k_len);
    check_run(run, hd, v_len);
    hd
}

/// The checks of a run of `G` queries (head dims a multiple of `lanes`) over rows of `k_len`
/// / `v_len` values, and the queries' and accumulators' pointers: `(hd, q, acc)`.
#[allow(clippy::type_complexity)]
pub(crate) fn multi_args<const G: usize>(
    q: &[&[f32]],
    lanes: usize,
    (k_len, v_len): (usize, usize),
    run: &Run,
    st: &[Online],
    acc: &mut [&mut [f32]],
) -> (usize, [*const f32; G], [*mut f32; G]) {
    assert!(q.len() == G && st.len() == G && acc.len() == G);
    let hd = q[0].len();
    assert!(hd.is_multiple_of(lanes) && q.iter().all(|x| x.len() == hd) && acc.iter().all(|a| a.len() == hd));
    check_run(run, hd, k_len);
    check_run(run, hd, v_len);
    (hd, std::array::from_fn(|g| q[g].as_ptr()), std::array::from_fn(|g| acc[g].as_mut_ptr()))
}

#[inline]
fn r16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// `acc, st` updated over `run` by llama.cpp's vector path. `q16`: the query, already rounded
/// to f16 values; `acc`: f16 values (as f32) of the unnormalized output.
pub fn vec_f16_run(q16: &[f32], k: &[f16], v: &[f16], run: Run, sc: Scoring, st: &mut Online, acc: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if q16.len().is_multiple_of(8) && super::Level::Avx2 <= super::detected_level() {
        // SAFETY: AVX2+FMA+F16C are present (the detected level implies them); the kernel
        // checks every length it reads.
        unsafe { super::x86::attn::vec_f16_run(q16, k, v, run, sc, st, acc) };
        return;
    }
    vec_f16_run_ref(q16, k, v, run, sc, st, acc)
}

/// Hint the cache to load `x[start..start + n]` (clamped to `x`): a run of cached rows the
/// next call will read. Does nothing where there is no prefetch instruction.
#[inline]
pub fn prefetch<T>(x: &[T], start: usize, n: usize) {
    let end = (start + n).min(x.len());
    if start >= end {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let (p, bytes) = (x[start..end].as_ptr() as *const i8, (end - start) * std::mem::size_of::<T>());
        for o in (0..bytes).step_by(64) {
            // SAFETY: a prefetch of an address inside `x` (prefetches never fault anyway).
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.add(o)) };
        }
    }
}

/// Reference twin of [`vec_f16_run`].
pub fn vec_f16_run_ref(q16: &[f32], k: &[f16], v: &[f16], run: Run, sc: Scoring, st: &mut Online, acc: &mut [f32]) {
    let hd = run_args(q16, 1, (k.len(), v.len()), &run, acc);
    for j in 0..run.len {
        let at = run.start + j * run.stride;
        let score = sc.apply(dot_f16_ggml(q16, &k[at..at + hd]));
        let vr = &v[at..at + hd];
        // ggml_vec_scale_f16 / ggml_vec_mad_f16: f32 math, f16 storage
        let (ms, w) = if score > st.m {
            let ms = (st.m - score).exp();
            st.m = score;
            acc.iter_mut().for_each(|a| *a = r16(*a * ms));
            (ms, 1.0)
        } else {
            (1.0, (score - st.m).exp())
        };
        acc.iter_mut().zip(vr).for_each(|(a, &v)| *a = r16(v.to_f32().mul_add(w, *a)));
        // S = S*ms + vs, contracted to an FMA by ggml's compiler
        st.s = st.s.mul_add(ms, w);
    }
}

/// [`vec_f16_run`] for `q16.len()` (1..=[`MULTI_MAX`]) queries over the same run (heads of
/// one KV head), in lock step position by position: the same bits as [`vec_f16_run`] per
/// query.
pub fn vec_f16_run_multi(q16: &[&[f32]], k: &[f16], v: &[f16], run: Run, sc: Scoring, st: &mut [Online], acc: &mut [&mut [f32]]) {
    assert!(q16.len() == st.len() && q16.len() == acc.len() && q16.len() <= MULTI_MAX, "vec_f16_run_multi: {} queries", q16.len());
    #[cfg(target_arch = "x86_64")]
    if q16.first().is_some_and(|q0| q0.len() % 16 == 0) && super::Level::Avx512 <= super::detected_level() {
        // SAFETY: AVX-512F/BW/VL present (the detected level); the kernel checks every length.
        // exponentials 16 at a time where that reproduces libm's `expf` bit for bit
        let vexp = super::x86::expf::matches_libm();
        unsafe {
            use super::x86::attn512::vec_f16_run_multi_avx512 as kernel;
            match q16.len() {
                1 => kernel::<1>(q16, k, v, run, sc, st, acc, vexp),
                2 => kernel::<2>(q16, k, v, run, sc, st, acc, vexp),
                3 => kernel::<3>(q16, k, v, run, sc, st, acc, vexp),
                _ => kernel::<4>(q16, k, v, run, sc, st, acc, vexp),
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if q16.first().is_some_and(|q0| q0.len() % 8 == 0) && super::Level::Avx2 <= super::detected_level() {
        // SAFETY: as in `vec_f16_run`; the kernel checks every length it reads.
        unsafe {
            match q16.len() {
                1 => super::x86::attn::vec_f16_run_multi::<1>(q16, k, v, run, sc, st, acc),
                2 => super::x86::attn::vec_f16_run_multi::<2>(q16, k, v, run, sc, st, acc),
                3 => super::x86::attn::vec_f16_run_multi::<3>(q16, k, v, run, sc, st, acc),
                _ => super::x86::attn::vec_f16_run_multi::<4>(q16, k, v, run, sc, st, acc),
            }
        }
        return;
    }
    vec_f16_run_multi_ref(q16, k, v, run, sc, st, acc)
}

/// Reference twin of [`vec_f16_run_multi`]: [`vec_f16_run_ref`] per query.
pub fn vec_f16_run_multi_ref(q16: &[&[f32]], k: &[f16], v: &[f16], run: Run, sc: Scoring, st: &mut [Online], acc: &mut [&mut [f32]]) {
    assert!(q16.len() == st.len() && q16.len() == acc.len());
    for ((q, st), acc) in q16.iter().zip(st.iter_mut()).zip(acc.iter_mut()) {
        vec_f16_run_ref(q, k, v, run, sc, st, acc);
    }
}

/// `ggml_vec_dot_f16` as ggml's AVX-512 build computes it: four 16-lane FMA accumulators
/// over 64-element steps, the accumulators folded pairwise (0+=2, 1+=3, 0+=1), then
/// `_mm512_reduce_add_ps`'s tree (8, 4, then 2+2 lanes), and the leftover elements added in
/// f64. The same bits as llama.cpp's decode attention scores.
fn dot_f16_ggml(a: &[f32], b: &[f16]) -> f32 {
    let n = a.len();
    let np = n & !63;
    let mut acc = [[0f32; 16]; 4];
    for i in (0..np).step_by(64) {
        for (j, accj) in acc.iter_mut().enumerate() {
            for (l, al) in accj.iter_mut().enumerate() {
                let k = i + j * 16 + l;
                *al = a[k].mul_add(b[k].to_f32(), *al);
            }
        }
    }
    let mut sum = crate::ggml_math::fold_lanes(&acc) as f64;
    for k in np..n {
        sum += (a[k] * b[k].to_f32()) as f64;
    }
    sum as f32
}

/// `acc, st` updated over `run` in f32 (prompt batches, or an f32 cache).
pub fn f32_run(q: &[f32], k: KvRows<'_>, v: KvRows<'_>, run: Run, sc: Scoring, st: &mut Online, acc: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if q.len().is_multiple_of(8) && super::Level::Avx2 <= super::detected_level() {
        // SAFETY: as in `vec_f16_run`.
        unsafe {
            match (k, v) {
                (KvRows::F16(k), KvRows::F16(v)) => super::x86::attn::f32_run(q, k, v, run, sc, st, acc),
                (KvRows::F32(k), KvRows::F32(v)) => super::x86::attn::f32_run(q, k, v, run, sc, st, acc),
                _ => f32_run_ref(q, k, v, run, sc, st, acc),
            }
        }
        return;
    }
    f32_run_ref(q, k, v, run, sc, st, acc)
}

/// Most queries one [`f32_run_multi`] call takes.
pub const MULTI_MAX: usize = 4;

/// [`f32_run`] for `q.len()` (1..=[`MULTI_MAX`]) queries over the same run (the heads of one
/// KV head), query `g` with state `st[g]` and accumulator `acc[g]`: the same bits as
/// [`f32_run`] per query, computed in lock step (a K row is read once for all of them).
pub fn f32_run_multi(q: &[&[f32]], k: KvRows<'_>, v: KvRows<'_>, run: Run, sc: Scoring, st: &mut [Online], acc: &mut [&mut [f32]]) {
    assert!(q.len() == st.len() && q.len() == acc.len() && q.len() <= MULTI_MAX, "f32_run_multi: {} queries", q.len());
    #[cfg(target_arch = "x86_64")]
    if q.first().is_some_and(|q0| q0.len() % 8 == 0) && super::Level::Avx2 <= super::detected_level() {
        macro_rules! go {
            ($k:expr, $v:expr) => {
                // SAFETY: as in `vec_f16_run`; the kernel checks every length it reads.
                unsafe {
                    match q.len() {
                        1 => super::x86::attn::f32_run_multi::<_, 1>(q, $k, $v, run, sc, st, acc),
                        2 => super::x86::attn::f32_run_multi::<_, 2>(q, $k, $v, run, sc, st, acc),
                        3 => super::x86::attn::f32_run_multi::<_, 3>(q, $k, $v, run, sc, st, acc),
                        _ => super::x86::attn::f32_run_multi::<_, 4>(q, $k, $v, run, sc, st, acc),
                    }
                }
            };
        }
        match (k, v) {
            (KvRows::F16(k), KvRows::F16(v)) => go!(k, v),
            (KvRows::F32(k), KvRows::F32(v)) => go!(k, v),
            _ => f32_run_multi_ref(q, k, v, run, sc, st, acc),
        }
        return;
    }
    f32_run_multi_ref(q, k, v, run, sc, st, acc)
}

/// Reference twin of [`f32_run_multi`]: [`f32_run_ref`] per query.
pub fn f32_run_multi_ref(q: &[&[f32]], k: KvRows<'_>, v: KvRows<'_>, run: Run, sc: Scoring, st: &mut [Online], acc: &mut [&mut [f32]]) {
    assert!(q.len() == st.len() && q.len() == acc.len());
    for ((q, st), acc) in q.iter().zip(st.iter_mut()).zip(acc.iter_mut()) {
        f32_run_ref(q, k, v, run, sc, st, acc);
    }
}

/// Reference twin of [`f32_run`].
pub fn f32_run_ref(q: &[f32], k: KvRows<'_>, v: KvRows<'_>, run: Run, sc: Scoring, st: &mut Online, acc: &mut [f32]) {
    run_args(q, 1, (k.len(), v.len()), &run, acc);
    for j in 0..run.len {
        let at = run.start + j * run.stride;
        let score = sc.apply(dot8(q, |i| k.at(at + i)));
        if score > st.m {
            let ms = (st.m - score).exp();
            acc.iter_mut().enumerate().for_each(|(d, a)| *a = *a * ms + v.at(at + d));
            st.s = st.s * ms + 1.0;
            st.m = score;
        } else {
            let w = (score - st.m).exp();
            acc.iter_mut().enumerate().for_each(|(d, a)| *a += v.at(at + d) * w);
            st.s += w;
        }
    }
}

/// `q·k` with 8 lane accumulators (mul, then add) over 8-element steps, the lanes summed in
/// order, then the leftover elements.
#[inline]
fn dot8(a: &[f32], b: impl Fn(usize) -> f32) -> f32 {
    let mut acc = [0f32; 8];
    let n8 = a.len() & !7;
    for i in (0..n8).step_by(8) {
        for l in 0..8 {
            acc[l] += a[i + l] * b(i + l);
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (i, x) in a.iter().enumerate().skip(n8) {
        s += x * b(i);
    }
    s
}
