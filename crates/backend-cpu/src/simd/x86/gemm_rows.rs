//! GEMM kernels (AVX-512 VNNI) for Q5_0 and Q5_1 weights giving every (row, token) output
//! exactly the bits of the AVX2 one-row kernels of `legacy.rs` (the matmul's kernels for
//! them), whose float order is: blocks in groups of 8, each group's 8 integer block sums
//! in the 8 lanes of one vector, `acc = fma(d_w * d_a, sums, acc)` (and Q5_1's
//! `extra = fma(m_w, s_a, extra)`) per group; the leftover `nb % 8` blocks one at a time
//! into `tail = fma(set1(d_w * d_a), cvt(4-element lane sums), tail)` (and
//! `tail_extra += m_w * s_a`); result `hsum(acc + tail) + (hsum(extra) + tail_extra)`.
//!
//! To get a group's block sums lane by lane without reductions, the panels interleave the
//! 8 blocks of a group: column `j` (32 bytes) holds elements `4j..4j+4` of blocks 0..8, so
//! `vpdpbusd` over the 8 columns sums block `k` in lane `k`. A 512-bit register holds two
//! tokens (lanes 0..8 and 8..16). Q5_0's `code - 16` is `code · y - 16 · Σ y` (the
//! precomputed start value). The leftover blocks use `gemm_ggml`'s element-order layout.
//!
//! ```text
//!  weight panel: G groups of [ROWS x 8 columns x 32 bytes | d: ROWS x 8 f32 | m: ROWS x 8 f32]
//!                then L blocks of [ROWS x 32 codes | d: ROWS f32 | m: ROWS f32]
//!  act panel:    G groups of [8 columns x PAIRS x 64 bytes | d_a: PAIRS x 16 f32 | off or s_a]
//!                then L blocks of [y: PAIRS x 64 | d_a: 8 copies per token | off (i32 x 8) or s_a]
//! ```

#![allow(clippy::needless_range_loop)] // index loops over the tile's registers

use super::{bytes_from_bits_32, f16_at, f32_at, hsum_ps, nibbles_32};
use crate::simd::{GEMM_ROWS as ROWS, GEMM_TOKENS as TOKENS};
use std::arch::x86_64::*;

const PAIRS: usize = TOKENS / 2;
const QK: usize = 32;
const _: () = assert!(TOKENS == 8);
/// Weight panel group: codes, d, m.
const WG: usize = ROWS * (8 * 32 + 8 * 4 + 8 * 4);
const WG_D: usize = ROWS * 8 * 32;
const WG_M: usize = WG_D + ROWS * 8 * 4;
/// Weight panel leftover block: codes, d, m.
const WT: usize = ROWS * (32 + 8);
/// Activation panel group: columns, d_a, off / s_a.
const AG: usize = 8 * PAIRS * 64 + 2 * PAIRS * 64;
const AG_D: usize = 8 * PAIRS * 64;
const AG_X: usize = AG_D + PAIRS * 64;
/// Activation panel leftover block: y, d_a, off / s_a.
const AT: usize = 3 * PAIRS * 64;

/// The types with a GEMM kernel here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ty {
    Q5_0,
    Q5_1,
}

/// Whether the CPU has what the kernels use.
pub(super) fn supported() -> bool {
    super::has_avx2() && super::has_avx512() && super::has_avx512vnni()
}

impl Ty {
    fn has_m(self) -> bool {
        self == Ty::Q5_1
    }

    /// Weight block bytes, and the offsets of `qh` and `qs` in it.
    fn wlayout(self) -> (usize, usize, usize) {
        match self {
            Ty::Q5_0 => (22, 2, 6),
            Ty::Q5_1 => (24, 4, 8),
        }
    }

    /// Activation block bytes (Q8_0 / Q8_1).
    fn ab(self) -> usize {
        if self.has_m() {
            36
        } else {
            34
        }
    }

    pub(crate) fn act_panel_bytes(self, n_in: usize) -> usize {
        let nb = n_in / QK;
        nb / 8 * AG + nb % 8 * AT
    }

    pub(crate) fn weight_panel_bytes(self, n_in: usize) -> usize {
        let nb = n_in / QK;
        nb / 8 * WG + nb % 8 * WT
    }

    pub(crate) fn pack_act(self, n_in: usize, rows: &[&[u8]], panel: &mut [u8]) {
        let (nb, ab) = (n_in / QK, self.ab());
        let (g, qo) = (nb / 8, ab - QK);
        assert!(n_in.is_multiple_of(QK) && rows.len() <= TOKENS && panel.len() >= self.act_panel_bytes(n_in));
        panel[..self.act_panel_bytes(n_in)].fill(0);
        let mut put = |o: usize, v: [u8; 4]| panel[o..o + 4].copy_from_slice(&v);
        for (t, row) in rows.iter().enumerate() {
            assert!(row.len() >= nb * ab);
            let (p, h) = (t / 2, (t % 2) * 32);
            for b in 0..nb {
                let src = &row[b * ab..(b + 1) * ab];
                let (y, d) = (&src[qo..qo + QK], f16(src, 0));
                let x = if self.has_m() { f16(src, 2).to_le_bytes() } else { (-16 * sum_i8(y)).to_le_bytes() };
                if b < 8 * g {
                    let (base, k) = (b / 8 * AG, b % 8);
                    for j in 0..8 {
                        let o = base + j * PAIRS * 64 + p * 64 + h + 4 * k;
                        put(o, y[4 * j..4 * j + 4].try_into().unwrap());
                    }
                    put(base + AG_D + p * 64 + h + 4 * k, d.to_le_bytes());
                    put(base + AG_X + p * 64 + h + 4 * k, x);
                } else {
                    let base = g * AG + (b - 8 * g) * AT;
                    for j in 0..8 {
                        put(base + p * 64 + h + 4 * j, y[4 * j..4 * j + 4].try_into().unwrap());
                        put(base + PAIRS * 64 + p * 64 + h + 4 * j, d.to_le_bytes());
                        if !self.has_m() {
                            put(base + 2 * PAIRS * 64 + p * 64 + h + 4 * j, (-16 * sum_i8(&y[4 * j..4 * j + 4])).to_le_bytes());
                        }
                    }
                    if self.has_m() {
                        put(base + 2 * PAIRS * 64 + 4 * t, x);
                    }
                }
            }
        }
    }

    pub(crate) fn pack_weights(self, n_in: usize, rows: &[&[u8]], panel: &mut [u8]) {
        let nb = n_in / QK;
        let bytes = self.weight_panel_bytes(n_in);
        assert!(supported() && n_in.is_multiple_of(QK) && rows.len() <= ROWS && panel.len() >= bytes);
        if rows.len() < ROWS {
            panel[..bytes].fill(0);
        }
        for (r, row) in rows.iter().enumerate() {
            assert!(row.len() >= nb * self.wlayout().0);
            // SAFETY: the CPU has AVX2+F16C (`supported()`); `row` holds `nb` blocks and the
            // panel is `weight_panel_bytes` long (asserted); `r < ROWS`.
            unsafe { pack_row(self, nb, row.as_ptr(), panel.as_mut_ptr(), r) };
        }
    }

    /// See `gemm::Kind::tile`.
    pub(crate) fn tile(self, n_in: usize, w: &[u8], a: &[u8], n_tok: usize, out: &mut [[f32; TOKENS]; ROWS]) {
        let nb = n_in / QK;
        assert!(supported());
        assert!(w.len() >= self.weight_panel_bytes(n_in) && a.len() >= self.act_panel_bytes(n_in) && (1..=TOKENS).contains(&n_tok));
        let (g, l, w, a) = (nb / 8, nb % 8, w.as_ptr(), a.as_ptr());
        macro_rules! go {
            ($m:expr) => {
                // SAFETY: the CPU has the features (`supported()` above); the panels hold the
                // `g` groups and `l` blocks (checked above), which is all the kernel reads.
                unsafe {
                    match n_tok.div_ceil(2) {
                        1 => tile::<1, $m>(g, l, w, a, n_tok, out),
                        2 => tile::<2, $m>(g, l, w, a, n_tok, out),
                        3 => tile::<3, $m>(g, l, w, a, n_tok, out),
                        _ => tile::<4, $m>(g, l, w, a, n_tok, out),
                    }
                }
            };
        }
        if self.has_m() {
            go!(true)
        } else {
            go!(false)
        }
    }
}

/// Row `r` of a weight panel from the `nb` GGUF blocks at `src`: groups of 8 blocks as
/// columns (an 8 x 8 transpose of the blocks' 4-byte groups), then the leftover blocks.
///
/// SAFETY: AVX2+FMA+F16C; `src` readable for `nb` blocks, `dst` writable for the panel of
/// `nb` blocks; `r < ROWS`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_row(ty: Ty, nb: usize, src: *const u8, dst: *mut u8, r: usize) {
    let (wb, qh, qs) = ty.wlayout();
    let codes = |b: usize| {
        let s = src.add(b * wb);
        _mm256_or_si256(nibbles_32(s.add(qs)), _mm256_and_si256(bytes_from_bits_32(s.add(qh)), _mm256_set1_epi8(0x10)))
    };
    let put = |p: *mut u8, v: f32| (p as *mut f32).write_unaligned(v);
    let g = nb / 8;
    for gi in 0..g {
        let base = dst.add(gi * WG);
        let c: [__m256i; 8] = std::array::from_fn(|k| codes(8 * gi + k));
        let t: [__m256i; 8] = std::array::from_fn(|k| {
            let (x, y) = (c[k / 2 * 2], c[k / 2 * 2 + 1]);
            if k % 2 == 0 {
                _mm256_unpacklo_epi32(x, y)
            } else {
                _mm256_unpackhi_epi32(x, y)
            }
        });
        // s[4h + i]: dword i (and 4 + i) of blocks 4h..4h+4
        let s: [__m256i; 8] = std::array::from_fn(|k| {
            let (h, i) = (k / 4, k % 4);
            let (x, y) = (t[4 * h + i / 2], t[4 * h + 2 + i / 2]);
            if i % 2 == 0 {
                _mm256_unpacklo_epi64(x, y)
            } else {
                _mm256_unpackhi_epi64(x, y)
            }
        });
        for j in 0..4 {
            let (lo, hi) = (s[j], s[4 + j]);
            _mm256_storeu_si256(base.add(r * 256 + j * 32) as *mut __m256i, _mm256_permute2x128_si256::<0x20>(lo, hi));
            _mm256_storeu_si256(base.add(r * 256 + (4 + j) * 32) as *mut __m256i, _mm256_permute2x128_si256::<0x31>(lo, hi));
        }
        for k in 0..8 {
            let b = src.add((8 * gi + k) * wb);
            put(base.add(WG_D + r * 32 + 4 * k), f16_at(b));
            put(base.add(WG_M + r * 32 + 4 * k), if ty.has_m() { f16_at(b.add(2)) } else { 0.0 });
        }
    }
    for b in 8 * g..nb {
        let base = dst.add(g * WG + (b - 8 * g) * WT);
        _mm256_storeu_si256(base.add(r * 32) as *mut __m256i, codes(b));
        let s = src.add(b * wb);
        put(base.add(ROWS * 32 + 4 * r), f16_at(s));
        put(base.add(ROWS * 36 + 4 * r), if ty.has_m() { f16_at(s.add(2)) } else { 0.0 });
    }
}

fn sum_i8(v: &[u8]) -> i32 {
    v.iter().map(|&b| b as i8 as i32).sum()
}

/// Little-endian f16 at `src[o..o + 2]` widened to f32 (exact, as `vcvtph2ps`).
fn f16(src: &[u8], o: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([src[o], src[o + 1]])).to_f32()
}

/// 8 f32 at `p` in both halves. SAFETY: `p..p+32` readable; AVX512F.
#[inline(always)]
unsafe fn bcast8_ps(p: *const u8) -> __m512 {
    _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(p as *const f64)))
}

/// `ROWS` x `2 * TP` tile over `g` groups then `l` leftover blocks; `M`: Q5_1 (`extra`),
/// else Q5_0 (start values `-16 · Σ y`).
///
/// SAFETY: AVX2+FMA+F16C+AVX512F/BW/VL/VNNI; `w` and `a` readable for the panels' `g`
/// groups and `l` blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<const TP: usize, const M: bool>(g: usize, l: usize, w: *const u8, a: *const u8, n_tok: usize, out: &mut [[f32; TOKENS]; ROWS]) {
    let zero = _mm512_setzero_ps();
    let mut acc = [[zero; TP]; ROWS];
    let mut extra = [[zero; TP]; ROWS];
    for gi in 0..g {
        let (wb, ab) = (w.add(gi * WG), a.add(gi * AG));
        for r in 0..ROWS {
            let mut s = [_mm512_setzero_si512(); TP];
            if !M {
                for p in 0..TP {
                    s[p] = _mm512_loadu_si512(ab.add(AG_X + 64 * p) as *const _);
                }
            }
            for j in 0..8 {
                let u = _mm512_broadcast_i64x4(_mm256_loadu_si256(wb.add(r * 256 + j * 32) as *const __m256i));
                for p in 0..TP {
                    s[p] = _mm512_dpbusd_epi32(s[p], u, _mm512_loadu_si512(ab.add(j * PAIRS * 64 + 64 * p) as *const _));
                }
            }
            let wd = bcast8_ps(wb.add(WG_D + r * 32));
            for p in 0..TP {
                let d = _mm512_mul_ps(wd, _mm512_loadu_ps(ab.add(AG_D + 64 * p) as *const f32));
                acc[r][p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s[p]), acc[r][p]);
            }
            if M {
                let wm = bcast8_ps(wb.add(WG_M + r * 32));
                for p in 0..TP {
                    extra[r][p] = _mm512_fmadd_ps(wm, _mm512_loadu_ps(ab.add(AG_X + 64 * p) as *const f32), extra[r][p]);
                }
            }
        }
    }
    let mut tail = [[zero; TP]; ROWS];
    let mut tail_extra = [_mm256_setzero_ps(); ROWS];
    let (w, a) = (w.add(g * WG), a.add(g * AG));
    for li in 0..l {
        let (wb, ab) = (w.add(li * WT), a.add(li * AT));
        for r in 0..ROWS {
            let u = _mm512_broadcast_i64x4(_mm256_loadu_si256(wb.add(32 * r) as *const __m256i));
            let dw = _mm512_set1_ps(f32_at(wb.add(ROWS * 32 + 4 * r)));
            for p in 0..TP {
                let start = if M { _mm512_setzero_si512() } else { _mm512_loadu_si512(ab.add(2 * PAIRS * 64 + 64 * p) as *const _) };
                let s = _mm512_dpbusd_epi32(start, u, _mm512_loadu_si512(ab.add(64 * p) as *const _));
                let d = _mm512_mul_ps(dw, _mm512_loadu_ps(ab.add(PAIRS * 64 + 64 * p) as *const f32));
                tail[r][p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), tail[r][p]);
            }
            if M {
                let wm = _mm256_set1_ps(f32_at(wb.add(ROWS * 36 + 4 * r)));
                tail_extra[r] = _mm256_add_ps(tail_extra[r], _mm256_mul_ps(wm, _mm256_loadu_ps(ab.add(2 * PAIRS * 64) as *const f32)));
            }
        }
    }
    for r in 0..ROWS {
        let mut te = [0f32; TOKENS];
        _mm256_storeu_ps(te.as_mut_ptr(), tail_extra[r]);
        for p in 0..TP {
            let (v, e) = (_mm512_add_ps(acc[r][p], tail[r][p]), extra[r][p]);
            for h in 0..2 {
                let t = 2 * p + h;
                if t < n_tok {
                    out[r][t] = hsum_ps(half(v, h)) + (hsum_ps(half(e, h)) + te[t]);
                }
            }
        }
    }
}

/// Lanes `8h..8h+8` of `v`.
#[inline(always)]
unsafe fn half(v: __m512, h: usize) -> __m256 {
    if h == 0 {
        _mm512_castps512_ps256(v)
    } else {
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))
    }
}

