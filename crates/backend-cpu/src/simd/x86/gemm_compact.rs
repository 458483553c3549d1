//! Compact kept weight panels for the 4-bit `gemm_ggml` types (Q4_0, Q4_1): the panel of
//! [`ROWS`] rows in half the bytes, expanded into the tiles' panel ([`Ty::pack_weights`]'s
//! layout, byte for byte) right before the tiles run over it.
//!
//! The tiles want each row's 32 codes of a block as bytes (8 lanes of 4) and `d`, `m` as f32:
//! 160 bytes per block of 4 rows, twice the GGUF rows' 80. A decode step of many sequences
//! streams every kept panel from memory once, so the panels are kept as
//!
//! ```text
//!  per block b (64 bytes):  byte k = code byte k of the tile panel (rows 0, 1)  in the low nibble
//!                                  | code byte 64 + k (rows 2, 3)             in the high nibble
//!  after all blocks, per block (16 bytes): d of rows 0..4, m of rows 0..4 as f16
//! ```
//!
//! and expanded with one AND, one shift + AND and one `vcvtph2ps` per block of 4 rows (the
//! tile itself spends about 100 vector instructions on it). `d` and `m` come from the rows'
//! f16 fields, so their f16 copies are exact.

use super::gemm_ggml::{Ty, ROWS, W_BLOCK};
use std::arch::x86_64::*;

const QK: usize = 32;
/// Code bytes per compact block, and scale bytes per compact block.
const C_CODES: usize = 64;
const C_SCALES: usize = 16;
const _: () = assert!(W_BLOCK == ROWS * 32 + 2 * ROWS * 4 && ROWS == 4);

impl Ty {
    /// Whether kept panels of this type are compact.
    pub(crate) fn compact(self) -> bool {
        matches!(self, Ty::Q4_0 | Ty::Q4_1)
    }

    /// Bytes of a compact panel of `n_in` values per row (a multiple of 16).
    pub(crate) fn compact_panel_bytes(self, n_in: usize) -> usize {
        n_in / QK * (C_CODES + C_SCALES)
    }

    /// Up to [`ROWS`] weight rows (GGUF blocks) into a compact panel (missing rows: zeros).
    /// Panics on short buffers or for a type without compact panels.
    pub(crate) fn pack_weights_compact(self, n_in: usize, rows: &[&[u8]], panel: &mut [u8]) {
        assert!(self.compact() && panel.len() >= self.compact_panel_bytes(n_in) && rows.len() <= ROWS);
        let (nb, wb) = (n_in / QK, if self == Ty::Q4_1 { 20 } else { 18 });
        let panel = &mut panel[..self.compact_panel_bytes(n_in)];
        panel.fill(0);
        let (codes, scales) = panel.split_at_mut(nb * C_CODES);
        for (r, row) in rows.iter().enumerate() {
            assert!(row.len() >= nb * wb);
            // the tile panel's code byte 32r + e of a block sits in compact byte (32r + e) % 64,
            // low nibble for rows 0, 1 and high nibble for rows 2, 3
            let (base, shift) = (32 * (r % 2), 4 * (r / 2));
            for b in 0..nb {
                let src = &row[b * wb..(b + 1) * wb];
                let qs = &src[wb - 16..];
                let dst = &mut codes[b * C_CODES + base..b * C_CODES + base + 32];
                for i in 0..16 {
                    dst[i] |= (qs[i] & 0x0f) << shift;
                    dst[16 + i] |= (qs[i] >> 4) << shift;
                }
                // d (and Q4_1's m) as stored: the tiles' f32 copies are their exact widening
                scales[b * C_SCALES + 2 * r..b * C_SCALES + 2 * r + 2].copy_from_slice(&src[0..2]);
                if self == Ty::Q4_1 {
                    scales[b * C_SCALES + 8 + 2 * r..b * C_SCALES + 8 + 2 * r + 2].copy_from_slice(&src[2..4]);
                }
            }
        }
    }

    /// A compact panel back into the tiles' panel (`nb * W_BLOCK` bytes): SIMD where the
    /// CPU has AVX-512, else [`expand_panel_reference`].
    pub(crate) fn expand_panel(self, n_in: usize, compact: &[u8], full: &mut [u8]) {
        let nb = n_in / QK;
        assert!(compact.len() >= self.compact_panel_bytes(n_in) && full.len() >= nb * W_BLOCK);
        if super::gemm_ggml::supported() {
            // SAFETY: the CPU has AVX-512F/BW + F16C (checked); both buffers hold `nb` blocks
            // (asserted).
            unsafe { expand_avx512(nb, compact.as_ptr(), full.as_mut_ptr()) }
        } else {
            expand_panel_reference(n_in, compact, full)
        }
    }
}

/// The scalar twin of [`Ty::expand_panel`].
pub(crate) fn expand_panel_reference(n_in: usize, compact: &[u8], full: &mut [u8]) {
    let nb = n_in / QK;
    let (codes, scales) = compact.split_at(nb * C_CODES);
    for b in 0..nb {
        let dst = &mut full[b * W_BLOCK..(b + 1) * W_BLOCK];
        for k in 0..C_CODES {
            let c = codes[b * C_CODES + k];
            dst[k] = c & 0x0f;
            dst[C_CODES + k] = c >> 4;
        }
        for i in 0..2 * ROWS {
            let h = u16::from_le_bytes([scales[b * C_SCALES + 2 * i], scales[b * C_SCALES + 2 * i + 1]]);
            let o = ROWS * 32 + 4 * i;
            dst[o..o + 4].copy_from_slice(&half::f16::from_bits(h).to_f32().to_le_bytes());
        }
    }
}

/// SAFETY: AVX-512F/BW + F16C; `c` readable for `nb` compact blocks, `f` writable for `nb`
/// panel blocks.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw")]
unsafe fn expand_avx512(nb: usize, c: *const u8, f: *mut u8) {
    let low = _mm512_set1_epi8(0x0f);
    let scales = c.add(nb * C_CODES);
    for b in 0..nb {
        let v = _mm512_loadu_si512(c.add(b * C_CODES) as *const _);
        let d = f.add(b * W_BLOCK);
        _mm512_storeu_si512(d as *mut _, _mm512_and_si512(v, low));
        _mm512_storeu_si512(d.add(C_CODES) as *mut _, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
        let s = _mm_loadu_si128(scales.add(b * C_SCALES) as *const __m128i);
        _mm256_storeu_ps(d.add(ROWS * 32) as *mut f32, _mm256_cvtph_ps(s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Random GGUF Q4_0 / Q4_1 blocks: any codes, finite f16 scales.
    fn rows(ty: Ty, nb: usize, n_rows: usize, seed: u64) -> Vec<Vec<u8>> {
        let wb = if ty == Ty::Q4_1 { 20 } else { 18 };
        let mut s = seed | 1;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        (0..n_rows)
            .map(|_| {
                let mut r: Vec<u8> = (0..nb * wb).map(|_| next() as u8).collect();
                for b in 0..nb {
                    for o in [0, 2] {
                        // exponent below 31: no inf / NaN
                        let h = (next() as u16) & 0xBBFF;
                        r[b * wb + o..b * wb + o + 2].copy_from_slice(&h.to_le_bytes());
                    }
                }
                r
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn compact_panels_expand_to_the_tile_panels(q41 in any::<bool>(), nb in 1usize..40, n_rows in 1usize..=ROWS, seed in any::<u64>()) {
            if !super::super::gemm_ggml::supported() {
                return Ok(());
            }
            let ty = if q41 { Ty::Q4_1 } else { Ty::Q4_0 };
            let n_in = nb * QK;
            let rs = rows(ty, nb, n_rows, seed);
            let refs: Vec<&[u8]> = rs.iter().map(|r| r.as_slice()).collect();
            let mut want = vec![0u8; nb * W_BLOCK];
            ty.pack_weights(n_in, &refs, &mut want);
            let mut compact = vec![0xAAu8; ty.compact_panel_bytes(n_in)];
            ty.pack_weights_compact(n_in, &refs, &mut compact);
            // SIMD and scalar expansion, into buffers holding garbage
            let mut got = vec![0x55u8; nb * W_BLOCK];
            ty.expand_panel(n_in, &compact, &mut got);
            let mut got_ref = vec![0x77u8; nb * W_BLOCK];
            expand_panel_reference(n_in, &compact, &mut got_ref);
            prop_assert_eq!(&got, &got_ref);
            // Q4_0's tile panel leaves m alone (zeros in a fresh panel): compare the rest
            for b in 0..nb {
                let m = if ty == Ty::Q4_1 { W_BLOCK } else { ROWS * 36 };
                prop_assert_eq!(&got[b * W_BLOCK..b * W_BLOCK + m], &want[b * W_BLOCK..b * W_BLOCK + m], "block {}", b);
            }
        }
    }
}
