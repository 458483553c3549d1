//! Wide GEMM tiles (AVX-512 VNNI) for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 weights: [`ROWS`] weight rows x
//! [`WIDE_TOKENS`] tokens, every output bit-identical to the llama.cpp-order one-row kernels
//! (`ggml_order.rs`), like `gemm_ggml`'s tiles, in fewer instructions per product.
//!
//! The one-row kernel keeps, per output, 8 lanes (lane `j` sums elements `4j..4j+4` of each
//! block) and does per block `acc = fma(d_w·d_a, float(lane sums), acc)`. Here a 512-bit
//! register holds lane `j` of one weight row for 16 tokens (token `t` in element `t`), so:
//!
//! ```text
//!  per block, row r, lane j:  sums = vpdpbusd(start_j, broadcast(row r bytes 4j..4j+4), y_j)
//!                             acc[r][j] = fma(P_r, sums - 1.5·2^23, acc[r][j])
//!  P_r = d_w(r) · d_a(t) over the tokens: one multiply per row and block (not per lane)
//!  end: hsum_float_8 of lanes 0..8 = ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)), 16 tokens at once
//! ```
//!
//! Integer lane sums become floats without `vcvtdq2ps` (which shares a port with
//! `vpdpbusd`): the panel's start value carries `0x4B40_0000` (1.5·2^23 as a float), so the
//! sum's bits read as a float are exactly `1.5·2^23 + sum` (|sum| < 2^22), and one exact
//! subtraction leaves `float(sum)`. Three vector instructions per 64 products where the
//! 2-token-pair tiles of `gemm_ggml` need four. Start values: Q4_0 `-8·Σy`, Q5_0 `-16·Σy`, Q8_0 `-128·Σy`
//! (the unsigned-weights trick of `gemm_ggml`), Q4_1 / Q5_1 none (plus their `summs` per token).
//!
//! Weight panels are `gemm_ggml`'s; activation panels, per block:
//!
//! ```text
//!  y: 8 lanes x 16 tokens x 4 bytes | d_a: 16 f32 | Q4_1: s_a 16 f32 ; Q4_0/Q8_0: start 8 x 16 i32
//! ```

#![allow(clippy::needless_range_loop)] // index loops over the tile's registers

use super::f32_at;
use super::gemm_ggml::{Ty, ROWS, W_BLOCK};
use std::arch::x86_64::*;

/// Tokens per wide tile (and per wide activation panel).
pub(crate) const WIDE_TOKENS: usize = 16;
const QK: usize = 32;
/// `1.5·2^23`: integers `k` with |k| < 2^22 added to its bits read back as `1.5·2^23 + k`.
const MAGIC: i32 = 0x4B40_0000;
const MAGIC_F: f32 = 12_582_912.0;
/// Offsets within a wide activation panel block.
const A_D: usize = 8 * 64;
const A_EXTRA: usize = A_D + 64;

impl Ty {
    fn wide_block(self) -> usize {
        if self.has_m() {
            A_EXTRA + 64
        } else {
            A_EXTRA + 8 * 64
        }
    }

    pub(crate) fn wide_act_panel_bytes(self, n_in: usize) -> usize {
        n_in / QK * self.wide_block()
    }

    /// Repack up to [`WIDE_TOKENS`] quantized activation rows (the weight's vec_dot_type)
    /// into a wide activation panel; missing tokens are zeros.
    pub(crate) fn pack_act_wide(self, n_in: usize, rows: &[&[u8]], panel: &mut [u8]) {
        let (nb, ab, pb) = (n_in / QK, self.ab(), self.wide_block());
        assert!(n_in.is_multiple_of(QK) && rows.len() <= WIDE_TOKENS && panel.len() >= nb * pb);
        let qo = ab - QK;
        let off = !self.has_m();
        let c = self.offset();
        // every byte of the panel written once (missing tokens: zeros, start MAGIC)
        for b in 0..nb {
            let dst = &mut panel[b * pb..(b + 1) * pb];
            for t in 0..WIDE_TOKENS {
                let put = |dst: &mut [u8], o: usize, v: [u8; 4]| dst[o + 4 * t..o + 4 * t + 4].copy_from_slice(&v);
                match rows.get(t) {
                    Some(row) => {
                        assert!(row.len() >= nb * ab);
                        let src = &row[b * ab..(b + 1) * ab];
                        let y = &src[qo..qo + QK];
                        for j in 0..8 {
                            put(dst, 64 * j, [y[4 * j], y[4 * j + 1], y[4 * j + 2], y[4 * j + 3]]);
                            if off {
                                let s: i32 = y[4 * j..4 * j + 4].iter().map(|&v| v as i8 as i32).sum();
                                put(dst, A_EXTRA + 64 * j, (MAGIC - c * s).to_le_bytes());
                            }
                        }
                        put(dst, A_D, f16(src, 0).to_le_bytes());
                        if !off {
                            put(dst, A_EXTRA, f16(src, 2).to_le_bytes());
                        }
                    }
                    None => {
                        for j in 0..8 {
                            put(dst, 64 * j, [0; 4]);
                            if off {
                                put(dst, A_EXTRA + 64 * j, MAGIC.to_le_bytes());
                            }
                        }
                        put(dst, A_D, [0; 4]);
                        if !off {
                            put(dst, A_EXTRA, [0; 4]);
                        }
                    }
                }
            }
        }
    }

    /// `out[t * ld + r]` = the one-row kernel's dot of weight row `r` (< [`ROWS`]) of the
    /// (`gemm_ggml`) weight panel with token `t` (< `n_tok`) of the wide activation panel
    /// (token-major, as the matmul's output is; other entries are left as they are).
    pub(crate) fn tile_wide(self, n_in: usize, w: &[u8], a: &[u8], n_tok: usize, out: &mut [f32], ld: usize) {
        let nb = n_in / QK;
        assert!(super::gemm_ggml::supported());
        assert!(w.len() >= nb * W_BLOCK && a.len() >= nb * self.wide_block() && (1..=WIDE_TOKENS).contains(&n_tok));
        assert!(ld >= ROWS && out.len() >= (n_tok - 1) * ld + ROWS);
        // SAFETY: the CPU has the features (asserted); the panels hold `nb` blocks and `out`
        // the n_tok rows of ROWS floats `ld` apart (asserted), which is all the kernel touches.
        unsafe {
            if self.has_m() {
                tile4::<false, true>(nb, w.as_ptr(), a.as_ptr(), self.wide_block(), n_tok, out.as_mut_ptr(), ld)
            } else {
                tile4::<true, false>(nb, w.as_ptr(), a.as_ptr(), self.wide_block(), n_tok, out.as_mut_ptr(), ld)
            }
        }
    }
}

fn f16(src: &[u8], o: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([src[o], src[o + 1]])).to_f32()
}

/// All [`ROWS`] rows of the weight panel against the 16 tokens of the activation panel, two
/// rows at a time, the results transposed to token-major rows of `ld` floats at `out`.
/// `OFF`: start values from the panel (Q4_0, Q8_0); `M`: Q4_1's `summs`.
///
/// SAFETY: AVX2+FMA+F16C+AVX512F/BW/VL/VNNI; `w` and `a` readable for `nb` panel blocks
/// (`pb` bytes each for `a`); `out + t * ld` writable for ROWS floats, t < n_tok.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile4<const OFF: bool, const M: bool>(nb: usize, w: *const u8, a: *const u8, pb: usize, n_tok: usize, out: *mut f32, ld: usize) {
    let [r0, r1] = tile2::<OFF, M>(nb, w, 0, a, pb);
    let [r2, r3] = tile2::<OFF, M>(nb, w, 2, a, pb);
    // 4x4 transposes within each 128-bit lane: t[m] lane k = rows 0..4 of token 4k + m
    let (x, y) = (_mm512_unpacklo_ps(r0, r1), _mm512_unpackhi_ps(r0, r1));
    let (z, v) = (_mm512_unpacklo_ps(r2, r3), _mm512_unpackhi_ps(r2, r3));
    let pd = _mm512_castps_pd;
    let t = [
        _mm512_castpd_ps(_mm512_unpacklo_pd(pd(x), pd(z))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(pd(x), pd(z))),
        _mm512_castpd_ps(_mm512_unpacklo_pd(pd(y), pd(v))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(pd(y), pd(v))),
    ];
    for (m, tm) in t.iter().enumerate() {
        let lanes = [
            _mm512_extractf32x4_ps::<0>(*tm),
            _mm512_extractf32x4_ps::<1>(*tm),
            _mm512_extractf32x4_ps::<2>(*tm),
            _mm512_extractf32x4_ps::<3>(*tm),
        ];
        for (k, l) in lanes.iter().enumerate() {
            let tok = 4 * k + m;
            if tok < n_tok {
                _mm_storeu_ps(out.add(tok * ld), *l);
            }
        }
    }
}

/// Rows `r0`, `r0 + 1` of the weight panel against the 16 tokens: one vector of 16 tokens'
/// results per row.
#[inline(always)]
unsafe fn tile2<const OFF: bool, const M: bool>(nb: usize, w: *const u8, r0: usize, a: *const u8, pb: usize) -> [__m512; 2] {
    let mut acc = [[_mm512_setzero_ps(); 8]; 2];
    let mut summs = [_mm512_setzero_ps(); 2];
    let magic_f = _mm512_set1_ps(MAGIC_F);
    for b in 0..nb {
        let wb = w.add(b * W_BLOCK);
        let ab = a.add(b * pb);
        if r0 == 0 {
            // the next weight panel (the caller's next tile), spread over the blocks: panels
            // larger than the L2 cache stream from memory
            let next = w.wrapping_add((nb + b) * W_BLOCK);
            for o in (0..W_BLOCK).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(o) as *const i8);
            }
        }
        let da = _mm512_loadu_ps(ab.add(A_D) as *const f32);
        for rr in 0..2 {
            let r = r0 + rr;
            let p = _mm512_mul_ps(_mm512_set1_ps(f32_at(wb.add(ROWS * 32 + 4 * r))), da);
            for j in 0..8 {
                let u = _mm512_set1_epi32((wb.add(32 * r + 4 * j) as *const i32).read_unaligned());
                let y = _mm512_loadu_si512(ab.add(64 * j) as *const _);
                let start = if OFF { _mm512_loadu_si512(ab.add(A_EXTRA + 64 * j) as *const _) } else { _mm512_set1_epi32(MAGIC) };
                let sums = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_dpbusd_epi32(start, u, y)), magic_f);
                acc[rr][j] = _mm512_fmadd_ps(p, sums, acc[rr][j]);
            }
            if M {
                let m = _mm512_set1_ps(f32_at(wb.add(ROWS * 36 + 4 * r)));
                summs[rr] = _mm512_fmadd_ps(m, _mm512_loadu_ps(ab.add(A_EXTRA) as *const f32), summs[rr]);
            }
        }
    }
    let mut res = [_mm512_setzero_ps(); 2];
    for rr in 0..2 {
        let a = &acc[rr];
        let b0 = _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6]));
        let b1 = _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7]));
        res[rr] = _mm512_add_ps(b0, b1);
        if M {
            // `+ summs` only for Q4_1: adding 0.0 would turn -0.0 into +0.0
            res[rr] = _mm512_add_ps(res[rr], summs[rr]);
        }
    }
    res
}
