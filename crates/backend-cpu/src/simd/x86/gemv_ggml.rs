//! Decode GEMV kernels (AVX-512 VNNI) for Q4_0, Q4_1 and Q8_0 weights: eight consecutive
//! weight rows against one quantized activation row, each result bit-identical to the
//! llama.cpp-order one-row kernel in `ggml_order.rs`.
//!
//! How the bits are kept: a 512-bit register holds the 8-lane accumulators of two rows (row
//! `2p` in the low half, `2p + 1` in the high half), and every lane does exactly what the
//! 256-bit kernel's lane does: `acc = fma(d_w * d_a, cvt(lane's integer sum), acc)` per block
//! in block order, then ggml's `hsum_float_8` per half, plus Q4_1's `summs` (one f32 lane per
//! row, `summs = fma(m_w, s_a, summs)` per block, as ggml's compiler contracts it). Integer
//! lane sums are exact whatever the method: Q4_1 `Σ q·y`; Q4_0 `Σ q·y - 8·Σ y = Σ (q-8)·y`;
//! Q8_0 `Σ (x+128)·y - 128·Σ y = Σ x·y` (the `- c·Σ y` term is the `vpdpbusd` start value,
//! computed once per block for all rows).
//!
//! What it saves over four-row AVX2 kernels: half the integer and float instructions per
//! row-block (two rows per instruction), one activation load per eight rows, and the weight
//! scales of eight rows converted by one `vcvtph2ps`. Rows are read in place (no repacking).
//!
//! ```text
//!  per block b:  y (32 B) ──broadcast to both halves──┐
//!  rows 2p,2p+1: codes ──► [row 2p | row 2p+1] bytes ─┴► vpdpbusd ─► cvt ─► fma(d_w·d_a) ─► acc[p]
//!  8 rows' (d, m) f16 ──► one vcvtph2ps ──► d·d_a ──► per-pair lane broadcast
//! ```

#![allow(clippy::needless_range_loop)] // index loops over the kernel's registers

use super::ggml_order::hsum;
use super::opaque;
use std::arch::x86_64::*;

/// The weight types with a kernel here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ty {
    Q4_0,
    Q4_1,
    Q8_0,
}

/// Rows per call.
pub(crate) const ROWS: usize = 8;

impl Ty {
    /// Bytes of one weight block / one activation block (GGUF layouts).
    pub(crate) fn wb(self) -> usize {
        match self {
            Ty::Q4_0 => 18,
            Ty::Q4_1 => 20,
            Ty::Q8_0 => 34,
        }
    }

    pub(crate) fn ab(self) -> usize {
        match self {
            Ty::Q4_1 => 36,
            _ => 34,
        }
    }
}

/// Whether the CPU has what the kernels use.
pub(crate) fn supported() -> bool {
    super::has_avx2() && super::has_avx512() && super::has_avx512vnni()
}

/// `out[r]` = the `ggml_order` one-row dot of row `r` of the [`ROWS`] rows that start at
/// `w` (`row_bytes` apart) with the activation row `a` (`n` values).
///
/// Panics unless the CPU is [`supported`] and the buffers hold the rows and the activations.
pub(crate) fn gemv8(ty: Ty, n: usize, w: &[u8], row_bytes: usize, a: &[u8], out: &mut [f32; ROWS]) {
    let nb = n / 32;
    assert!(supported(), "gemv8: CPU lacks AVX-512 VNNI");
    assert!(row_bytes >= nb * ty.wb() && w.len() >= (ROWS - 1) * row_bytes + nb * ty.wb() && a.len() >= nb * ty.ab());
    // SAFETY: features checked above; `w` holds ROWS rows of `nb` blocks `row_bytes` apart
    // and `a` `nb` activation blocks (asserted), which is all the kernel reads (prefetches
    // may point past the end; they never fault).
    unsafe {
        match ty {
            Ty::Q4_0 => kernel::<0>(nb, w.as_ptr(), row_bytes, a.as_ptr(), out),
            Ty::Q4_1 => kernel::<1>(nb, w.as_ptr(), row_bytes, a.as_ptr(), out),
            Ty::Q8_0 => kernel::<2>(nb, w.as_ptr(), row_bytes, a.as_ptr(), out),
        }
    }
}

/// The kernel; `T`: 0 = Q4_0, 1 = Q4_1, 2 = Q8_0.
///
/// SAFETY: AVX2+FMA+F16C+AVX512F/BW/VL/VNNI; `w + r * rb` readable for `nb` weight blocks
/// (r < ROWS), `a` for `nb` activation blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn kernel<const T: u8>(nb: usize, w: *const u8, rb: usize, a: *const u8, out: &mut [f32; ROWS]) {
    let (wbs, abs) = match T {
        0 => (18usize, 34usize),
        1 => (20, 36),
        _ => (34, 34),
    };
    // offset of the codes in a weight block / activation block
    let (wq, aq) = match T {
        0 => (2usize, 2usize),
        1 => (4, 4),
        _ => (2, 2),
    };
    let mut acc = [_mm512_setzero_ps(); ROWS / 2];
    // lane 2r + 1: row r's `summs` (Q4_1); even lanes unused
    let mut summs = _mm512_setzero_ps();
    let mask = _mm512_set1_epi8(0x0f);
    // shift counts per 64-bit element: [row 2p codes | row 2p codes >> 4 | row 2p+1 ... ]
    let shifts = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    // lane index of row r's `d` in the converted (d, m) vector is 2r: broadcast row 2p to
    // lanes 0..8 and row 2p + 1 to lanes 8..16
    let idx: [__m512i; ROWS / 2] = [
        _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0),
        _mm512_set_epi32(6, 6, 6, 6, 6, 6, 6, 6, 4, 4, 4, 4, 4, 4, 4, 4),
        _mm512_set_epi32(10, 10, 10, 10, 10, 10, 10, 10, 8, 8, 8, 8, 8, 8, 8, 8),
        _mm512_set_epi32(14, 14, 14, 14, 14, 14, 14, 14, 12, 12, 12, 12, 12, 12, 12, 12),
    ];
    // prefetch the next eight rows, spread over the blocks
    let next = w.wrapping_add(ROWS * rb);
    let pf_step = (ROWS * rb).div_ceil(nb.max(1)).div_ceil(64) * 64;
    for b in 0..nb {
        let ab = a.add(b * abs);
        let wb = w.add(b * wbs);
        let mut o = 0;
        while o < pf_step {
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(b * pf_step + o) as *const i8);
            o += 64;
        }
        // activations: the 32 codes in both 256-bit halves, the scale, Q4_1's sum
        let y = _mm512_broadcast_i64x4(_mm256_loadu_si256(ab.add(aq) as *const __m256i));
        let da = _mm512_set1_ps(super::f16_at(ab));
        let start = match T {
            // -8·Σy, -128·Σy per 4-group lane
            0 => _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(8), y)),
            2 => _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(-128), y)),
            _ => _mm512_setzero_si512(),
        };
        // the eight rows' first four bytes (d, then m or codes) as 16 f16 -> f32
        let v = |r: usize| (wb.add(r * rb) as *const u32).read_unaligned() as u64;
        let dm = _mm512_cvtph_ps(_mm256_set_epi64x(
            opaque(v(6) | v(7) << 32) as i64,
            opaque(v(4) | v(5) << 32) as i64,
            opaque(v(2) | v(3) << 32) as i64,
            opaque(v(0) | v(1) << 32) as i64,
        ));
        if T == 1 {
            summs = _mm512_fmadd_ps(dm, _mm512_set1_ps(super::f16_at(ab.add(2))), summs);
        }
        let d = _mm512_mul_ps(dm, da);
        for p in 0..ROWS / 2 {
            let (r0, r1) = (wb.add(2 * p * rb + wq), wb.add((2 * p + 1) * rb + wq));
            let u = if T == 2 {
                let x = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256(r0 as *const __m256i)),
                    _mm256_loadu_si256(r1 as *const __m256i),
                    1,
                );
                _mm512_xor_si512(x, _mm512_set1_epi8(-128))
            } else {
                let x = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_loadu_si128(r0 as *const __m128i))),
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(r1 as *const __m128i)),
                    1,
                );
                _mm512_and_si512(_mm512_srlv_epi64(x, shifts), mask)
            };
            let sums = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, u, y));
            acc[p] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx[p], d), sums, acc[p]);
        }
    }
    let mut s = [0f32; 16];
    _mm512_storeu_ps(s.as_mut_ptr(), summs);
    for p in 0..ROWS / 2 {
        let lo = _mm512_castps512_ps256(acc[p]);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[p]), 1));
        for (h, v) in [lo, hi].into_iter().enumerate() {
            let r = 2 * p + h;
            // `+ summs` only for Q4_1: adding 0.0 would turn -0.0 into +0.0
            out[r] = if T == 1 { hsum(v) + s[2 * r + 1] } else { hsum(v) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quarrel_core::QuantType;

    #[test]
    fn bit_identical_to_the_one_row_kernels() {
        if !supported() {
            return;
        }
        let mut rnd = super::super::test_rnd(777);
        for (ty, qt) in [(Ty::Q4_0, QuantType::Q4_0), (Ty::Q4_1, QuantType::Q4_1), (Ty::Q8_0, QuantType::Q8_0)] {
            for nb in [1usize, 2, 3, 18, 48, 176] {
                let n = nb * 32;
                let x: Vec<f32> = (0..n * ROWS).map(|_| rnd()).collect();
                let w = quarrel_quant::quantize_to_vec(qt, &x).unwrap();
                let xa: Vec<f32> = (0..n).map(|_| rnd()).collect();
                let a = quarrel_quant::quantize_to_vec(qt.vec_dot_type(), &xa).unwrap();
                let rb = qt.row_bytes(n).unwrap();
                let mut out = [0f32; ROWS];
                gemv8(ty, n, &w, rb, &a, &mut out);
                let one = super::super::ggml_order::dot_fn(qt).unwrap();
                for r in 0..ROWS {
                    let want = one(n, &w[r * rb..(r + 1) * rb], &a);
                    assert_eq!(out[r].to_bits(), want.to_bits(), "{ty:?} nb {nb} row {r}: {} vs {want}", out[r]);
                }
            }
        }
    }
}
