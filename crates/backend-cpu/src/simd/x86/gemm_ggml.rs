//! GEMM micro-kernels (AVX-512 VNNI) for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 weights that give, for every
//! (row, token) output, exactly the bits of the llama.cpp-order one-row kernels in
//! `ggml_order.rs`: each output keeps its own 8-lane accumulator, updated once per block in
//! block order with `acc = fma(d_w * d_a, cvt(block lane sums), acc)`, reduced with ggml's
//! `hsum_float_8`, plus Q4_1's / Q5_1's sequential `summs = fma(m_w, s_a, summs)`.
//!
//! What the tile shares: a 512-bit register holds the 8-lane accumulators of two tokens (the
//! lane-wise operations are the same ones the 256-bit kernel does), a weight block is unpacked
//! once for [`TOKENS`] tokens, an activation block is loaded once for [`ROWS`] rows.
//!
//! Both operands are repacked first (by the caller, once per matmul / per task):
//!
//! ```text
//!  weight panel, per block, ROWS rows:  u: ROWS x 32 bytes (unsigned codes) | d: ROWS f32 | m: ROWS f32
//!  activation panel, per block, TOKENS: y: 32 bytes per token (token pairs = 64 bytes)
//!                                       | d_a: 8 copies per token (f32) | off (i32 x 8 per token) or s_a (f32)
//! ```
//!
//! Integer block sums are exact whatever the method, and equal lane for lane (lane `j` is the
//! dot of elements `4j..4j+4`): Q4_1 / Q5_1 `Σ q·y`; Q4_0 `Σ q·y - 8·Σ y = Σ (q-8)·y`;
//! Q5_0 (5-bit codes) `Σ q·y - 16·Σ y`; Q8_0
//! `Σ (x+128)·y - 128·Σ y = Σ x·y` (the `- c·Σ y` term is the precomputed `off`, the
//! `vpdpbusd` start value). The one-row kernels' sign trick gives the same sums for
//! activations in -127..=127 (all the activation quantizers produce).

#![allow(clippy::needless_range_loop)] // index loops over the tile's registers

use super::f32_at;
use super::ggml_order::hsum;
use std::arch::x86_64::*;

/// Weight rows per tile.
pub(crate) const ROWS: usize = crate::simd::GEMM_ROWS;
/// Tokens per tile (and per activation panel).
pub(crate) const TOKENS: usize = crate::simd::GEMM_TOKENS;
const PAIRS: usize = TOKENS / 2;
// Q4_1's `summs` of a row are one 256-bit vector over the tile's tokens.
const _: () = assert!(TOKENS == 8);
const QK: usize = 32;
/// Bytes per block of a weight panel: codes, d, m (a multiple of 32, so that no 32-byte
/// load crosses a cache line in a 64-byte aligned panel).
pub(super) const W_BLOCK: usize = ROWS * 32 + 2 * ROWS * 4;
/// Offsets within an activation panel block.
const A_D: usize = PAIRS * 64;
const A_EXTRA: usize = 2 * PAIRS * 64;

/// The types with a GEMM kernel here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ty {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
}

/// Whether the CPU has what the kernels use.
pub(super) fn supported() -> bool {
    super::has_avx2() && super::has_avx512() && super::has_avx512vnni()
}

impl Ty {
    /// Bytes of one weight block / one activation block in the GGUF layouts.
    fn wb(self) -> usize {
        match self {
            Ty::Q4_0 => 18,
            Ty::Q4_1 => 20,
            Ty::Q5_0 => 22,
            Ty::Q5_1 => 24,
            Ty::Q8_0 => 34,
        }
    }

    pub(super) fn ab(self) -> usize {
        if self.has_m() {
            36
        } else {
            34
        }
    }

    /// The type has a min (`m`, paired with the Q8_1 activations' `s`).
    pub(super) fn has_m(self) -> bool {
        matches!(self, Ty::Q4_1 | Ty::Q5_1)
    }

    /// The code offset `c` of a signed type (value = code - c), whose `- c·Σ y` starts the
    /// integer sums; 0 for the types with a min.
    pub(super) fn offset(self) -> i32 {
        match self {
            Ty::Q4_0 => 8,
            Ty::Q5_0 => 16,
            Ty::Q8_0 => 128,
            Ty::Q4_1 | Ty::Q5_1 => 0,
        }
    }

    /// Bytes of one block of an activation panel (a multiple of 64).
    fn a_block(self) -> usize {
        if self.has_m() {
            // y, d, s (8 f32, padded to 64 bytes)
            A_EXTRA + 64
        } else {
            // y, d, off
            A_EXTRA + PAIRS * 64
        }
    }

    pub(crate) fn act_panel_bytes(self, n_in: usize) -> usize {
        n_in / QK * self.a_block()
    }

    pub(crate) fn weight_panel_bytes(self, n_in: usize) -> usize {
        n_in / QK * W_BLOCK
    }

    /// Repack up to [`TOKENS`] quantized activation rows (the weight's vec_dot_type, `n_in`
    /// values each) into an activation panel; missing tokens are zeros.
    pub(crate) fn pack_act(self, n_in: usize, rows: &[&[u8]], panel: &mut [u8]) {
        let (nb, ab, pb) = (n_in / QK, self.ab(), self.a_block());
        assert!(n_in.is_multiple_of(QK) && rows.len() <= TOKENS && panel.len() >= nb * pb);
        let qo = ab - QK;
        panel[..nb * pb].fill(0);
        for (t, row) in rows.iter().enumerate() {
            assert!(row.len() >= nb * ab);
            let (p, h) = (t / 2, (t % 2) * 32);
            for b in 0..nb {
                let src = &row[b * ab..(b + 1) * ab];
                let dst = &mut panel[b * pb..(b + 1) * pb];
                let y = &src[qo..];
                dst[p * 64 + h..p * 64 + h + 32].copy_from_slice(y);
                let d = f16(src, 0).to_le_bytes();
                for k in 0..8 {
                    let o = A_D + p * 64 + h + 4 * k;
                    dst[o..o + 4].copy_from_slice(&d);
                }
                match self.has_m() {
                    true => {
                        let o = A_EXTRA + 4 * t;
                        dst[o..o + 4].copy_from_slice(&f16(src, 2).to_le_bytes());
                    }
                    false => {
                        let c = self.offset();
                        for j in 0..8 {
                            let s: i32 = y[4 * j..4 * j + 4].iter().map(|&v| v as i8 as i32).sum();
                            let o = A_EXTRA + p * 64 + h + 4 * j;
                            dst[o..o + 4].copy_from_slice(&(-c * s).to_le_bytes());
                        }
                    }
                }
            }
        }
    }

    /// Repack up to [`ROWS`] weight rows (`n_in` values each) into a weight panel; missing
    /// rows are zeros.
    pub(crate) fn pack_weights(self, n_in: usize, rows: &[&[u8]], panel: &mut [u8]) {
        let (nb, wb) = (n_in / QK, self.wb());
        assert!(supported() && n_in.is_multiple_of(QK) && rows.len() <= ROWS && panel.len() >= nb * W_BLOCK);
        if rows.len() < ROWS {
            panel[..nb * W_BLOCK].fill(0);
        }
        for (r, row) in rows.iter().enumerate() {
            assert!(row.len() >= nb * wb);
            // SAFETY: the CPU has AVX2+F16C (`supported()`); `row` holds `nb` blocks and the
            // panel `nb` panel blocks (asserted), `r < ROWS`.
            unsafe { pack_row(self, nb, row.as_ptr(), panel.as_mut_ptr(), r) };
        }
    }

    /// `out[r][t]` = the one-row kernel's dot of weight row `r` with token `t` of the panels
    /// (`t < n_tok <= TOKENS`; other entries are left as they are).
    pub(crate) fn tile(self, n_in: usize, w: &[u8], a: &[u8], n_tok: usize, out: &mut [[f32; TOKENS]; ROWS]) {
        let nb = n_in / QK;
        assert!(supported());
        assert!(w.len() >= nb * W_BLOCK && a.len() >= nb * self.a_block() && (1..=TOKENS).contains(&n_tok));
        let (w, a) = (w.as_ptr(), a.as_ptr());
        macro_rules! go {
            ($off:expr, $m:expr) => {
                // SAFETY: the CPU has the features (`supported()` above); the panels hold `nb`
                // blocks (checked above), which is all the kernel reads.
                unsafe {
                    match n_tok.div_ceil(2) {
                        1 => tile::<1, $off, $m>(nb, w, a, self.a_block(), n_tok, out),
                        2 => tile::<2, $off, $m>(nb, w, a, self.a_block(), n_tok, out),
                        3 => tile::<3, $off, $m>(nb, w, a, self.a_block(), n_tok, out),
                        _ => tile::<4, $off, $m>(nb, w, a, self.a_block(), n_tok, out),
                    }
                }
            };
        }
        if self.has_m() {
            go!(false, true)
        } else {
            go!(true, false)
        }
    }
}

/// Row `r` of a weight panel from the `nb` GGUF blocks at `src`.
///
/// SAFETY: AVX2+FMA+F16C; `src` readable for `nb` blocks, `dst` writable for `nb` panel
/// blocks; `r < ROWS`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_row(ty: Ty, nb: usize, src: *const u8, dst: *mut u8, r: usize) {
    let wb = ty.wb();
    for b in 0..nb {
        let (s, d) = (src.add(b * wb), dst.add(b * W_BLOCK));
        let u = match ty {
            Ty::Q4_0 | Ty::Q4_1 => unpack_nibbles(s.add(wb - 16)),
            // the 5th bits (u32 `qh` before the nibbles) as 0x10
            Ty::Q5_0 | Ty::Q5_1 => {
                _mm256_or_si256(unpack_nibbles(s.add(wb - 16)), _mm256_and_si256(bytes_from_bits(s.add(wb - 20)), _mm256_set1_epi8(0x10)))
            }
            Ty::Q8_0 => _mm256_xor_si256(_mm256_loadu_si256(s.add(2) as *const __m256i), _mm256_set1_epi8(-128)),
        };
        _mm256_storeu_si256(d.add(32 * r) as *mut __m256i, u);
        (d.add(ROWS * 32 + 4 * r) as *mut f32).write_unaligned(super::f16_at(s));
        if ty.has_m() {
            (d.add(ROWS * 36 + 4 * r) as *mut f32).write_unaligned(super::f16_at(s.add(2)));
        }
    }
}

/// Byte `j` 0xFF where bit `j` of the u32 at `p` is set. SAFETY: `p..p+4` readable; AVX2.
#[inline(always)]
unsafe fn bytes_from_bits(p: *const u8) -> __m256i {
    let x = (p as *const u32).read_unaligned() as i32;
    let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    let bytes = _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(x), shuf), _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// 16 bytes of packed nibbles -> 32 bytes: low nibbles (elements 0..16) then high (16..32).
/// SAFETY: `p..p+16` readable; AVX2.
#[inline(always)]
unsafe fn unpack_nibbles(p: *const u8) -> __m256i {
    let t = _mm_loadu_si128(p as *const __m128i);
    let v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
}

/// Little-endian f16 at `src[o..o + 2]` widened to f32 (exact, as `vcvtph2ps`).
fn f16(src: &[u8], o: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([src[o], src[o + 1]])).to_f32()
}

/// `ROWS` x `2 * TP` tile over `nb` blocks. `OFF`: start each block's integer sums at the
/// panel's `off` (Q4_0, Q8_0); `M`: Q4_1's `summs`.
///
/// SAFETY: AVX2+FMA+F16C+AVX512F/BW/VL/VNNI; `w` and `a` readable for `nb` panel blocks
/// (`a_block` bytes each for `a`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<const TP: usize, const OFF: bool, const M: bool>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    a_block: usize,
    n_tok: usize,
    out: &mut [[f32; TOKENS]; ROWS],
) {
    let mut acc = [[_mm512_setzero_ps(); TP]; ROWS];
    let mut summs = [_mm256_setzero_ps(); ROWS];
    for b in 0..nb {
        let wb = w.add(b * W_BLOCK);
        let ab = a.add(b * a_block);
        // the next weight panel (the caller's next tile), spread over the blocks: panels
        // larger than the L2 cache stream from memory
        let next = w.wrapping_add((nb + b) * W_BLOCK);
        for o in (0..W_BLOCK).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(o) as *const i8);
        }
        let mut y = [_mm512_setzero_si512(); TP];
        let mut da = [_mm512_setzero_ps(); TP];
        for p in 0..TP {
            y[p] = _mm512_loadu_si512(ab.add(64 * p) as *const _);
            da[p] = _mm512_loadu_ps(ab.add(A_D + 64 * p) as *const f32);
        }
        for r in 0..ROWS {
            let u = _mm512_broadcast_i64x4(_mm256_loadu_si256(wb.add(32 * r) as *const __m256i));
            let dw = _mm512_set1_ps(f32_at(wb.add(ROWS * 32 + 4 * r)));
            for p in 0..TP {
                let start = if OFF { _mm512_loadu_si512(ab.add(A_EXTRA + 64 * p) as *const _) } else { _mm512_setzero_si512() };
                let sums = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, u, y[p]));
                acc[r][p] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da[p]), sums, acc[r][p]);
            }
            if M {
                let m = _mm256_set1_ps(f32_at(wb.add(ROWS * 32 + ROWS * 4 + 4 * r)));
                summs[r] = _mm256_fmadd_ps(m, _mm256_loadu_ps(ab.add(A_EXTRA) as *const f32), summs[r]);
            }
        }
    }
    for r in 0..ROWS {
        let mut s = [0f32; TOKENS];
        _mm256_storeu_ps(s.as_mut_ptr(), summs[r]);
        for p in 0..TP {
            let lo = _mm512_castps512_ps256(acc[r][p]);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r][p]), 1));
            for (h, v) in [lo, hi].into_iter().enumerate() {
                let t = 2 * p + h;
                if t < n_tok {
                    // `+ summs` only with a min: adding 0.0 would turn -0.0 into +0.0
                    out[r][t] = if M { hsum(v) + s[t] } else { hsum(v) };
                }
            }
        }
    }
}
