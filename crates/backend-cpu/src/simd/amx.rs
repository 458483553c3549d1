//! F16 matrix multiplication on the CPU's matrix units (Intel AMX, `tdpbf16ps`: 16 x 16 f32
//! tiles += bf16 pairs), for encoders' batches (see `crate::matmul_amx` for when it is used).
//!
//! An F16 value (11 significant bits) is exactly the sum of two bf16 values (8 bits each):
//! `hi`, its nearest bf16, and `lo`, the remainder. Activations are rounded to F16 first (ggml's
//! `vec_dot_type` for F16 weights, as the vector kernels do), so a product is
//! `x w = xh wh + xl wh + xh wl + xl wl` with every bf16 product exact in f32. The tiles sum the
//! first three (`|xl wl|` is at most 2^-16 of `|x w|`) in f32: each output is a sum of exact
//! products, as in the vector kernels, in another order. That order is fixed per output
//! (blocks of 32 inputs in turn; within one, the `hh`, `lh`, `hl` passes), whatever other
//! tokens or rows share the tiles: results do not depend on the batch.
//!
//! Layouts: weights in groups of 16 rows; per group and block of 32 inputs, two 1 KB tiles (hi,
//! then lo) whose row `i` holds, for each of the 16 rows, the pair of inputs `2i, 2i + 1` (the
//! layout `tdpbf16ps` reads its second operand in). Activations: a hi and a lo matrix of bf16,
//! one row per token, rows padded to a multiple of 32 inputs with zeros.
//!
//! [`matmul_reference`] is the plain twin (f64 sums of the F16-rounded operands);
//! `tests/amx_vs_reference.rs` holds the tiles to it.

use quarrel_quant::{f32_to_fp16, fp16_to_f32};

/// Inputs per block (one tile row of bf16 pairs).
pub const K_BLOCK: usize = 32;
/// Rows per weight group and tokens per activation tile.
pub const TILE: usize = 16;
/// Bytes of one tile (16 rows of 64 bytes).
const TILE_BYTES: usize = 1024;

/// Whether the matrix units can be used: an x86-64 CPU with AMX-TILE and AMX-BF16, the
/// AVX-512 kernels allowed (`QUARREL_SIMD` does not cap below them), and the kernel's
/// permission for the tile state granted (Linux `arch_prctl(ARCH_REQ_XCOMP_PERM)`, asked
/// once for the process).
pub fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            if crate::simd::detected_level() < crate::simd::Level::Avx512 {
                return false;
            }
            // leaf 7 exists on every CPU with AVX-512 (checked above)
            let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
            let (bf16, tile) = (edx >> 22 & 1 == 1, edx >> 24 & 1 == 1);
            if !(bf16 && tile) {
                return false;
            }
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: a request for a permission; no memory is passed.
            unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        false
    })
}

/// Blocks of [`K_BLOCK`] inputs in a row of `n_in` (the last one zero-padded).
pub fn k_blocks(n_in: usize) -> usize {
    n_in.div_ceil(K_BLOCK)
}

/// Bytes of one packed group of [`TILE`] weight rows of `n_in` inputs.
pub fn group_bytes(n_in: usize) -> usize {
    k_blocks(n_in) * 2 * TILE_BYTES
}

/// Bytes of one activation row (hi or lo) of `n_in` inputs.
pub fn act_row_bytes(n_in: usize) -> usize {
    k_blocks(n_in) * K_BLOCK * 2
}

/// `v` (exactly an F16 value widened) as `(hi, lo)` bf16 bits with `hi + lo == v` exactly.
#[inline]
fn split(v: f32) -> (u16, u16) {
    let b = v.to_bits();
    let hi = b.wrapping_add(0x7fff + (b >> 16 & 1)) & 0xffff_0000;
    let lo = v - f32::from_bits(hi);
    ((hi >> 16) as u16, (lo.to_bits() >> 16) as u16)
}

/// Up to [`TILE`] F16 weight rows of `n_in` inputs (`rows[n]`: `2 n_in` bytes) into one packed
/// group (`out`: [`group_bytes`] bytes; missing rows and inputs are zero).
pub fn pack_group(n_in: usize, rows: &[&[u8]], out: &mut [u8]) {
    assert!(rows.iter().all(|r| r.len() >= 2 * n_in), "amx weight group: short row");
    pack_group_with(n_in, rows.len(), |n, k| fp16_to_f32(u16::from_le_bytes([rows[n][2 * k], rows[n][2 * k + 1]])), out);
}

/// [`pack_group`] of `n_rows` (at most [`TILE`]) rows whose input `k` of row `n` is `value(n,
/// k)`, an F16 value (widened), so that its hi and lo halves are exact.
pub fn pack_group_with(n_in: usize, n_rows: usize, value: impl Fn(usize, usize) -> f32, out: &mut [u8]) {
    assert!(n_rows <= TILE && out.len() >= group_bytes(n_in), "amx weight group: short buffer");
    out[..group_bytes(n_in)].fill(0);
    for b in 0..k_blocks(n_in) {
        let tiles = &mut out[b * 2 * TILE_BYTES..(b + 1) * 2 * TILE_BYTES];
        let (hi, lo) = tiles.split_at_mut(TILE_BYTES);
        for n in 0..n_rows {
            for k in b * K_BLOCK..((b + 1) * K_BLOCK).min(n_in) {
                let (h, l) = split(value(n, k));
                // tile row i = (k % 32) / 2, column pair n, element k % 2
                let at = ((k % K_BLOCK) / 2) * 64 + n * 4 + (k % 2) * 2;
                hi[at..at + 2].copy_from_slice(&h.to_le_bytes());
                lo[at..at + 2].copy_from_slice(&l.to_le_bytes());
            }
        }
    }
}

/// One token's activations `x` rounded to F16 and split into its hi and lo rows
/// ([`act_row_bytes`] bytes each; the padding is zeroed).
pub fn pack_act_row(x: &[f32], hi: &mut [u8], lo: &mut [u8]) {
    split_row(x, true, hi, lo);
}

/// `x` split into hi and lo bf16 rows ([`act_row_bytes`] bytes each; the padding is zeroed),
/// rounded to F16 first where `to_f16` (then `hi + lo` is that value exactly; else it is `x`
/// to 16 significant bits).
pub fn split_row(x: &[f32], to_f16: bool, hi: &mut [u8], lo: &mut [u8]) {
    let n = act_row_bytes(x.len());
    assert!(hi.len() >= n && lo.len() >= n, "amx activation row: short buffer");
    let round = |v: f32| if to_f16 { fp16_to_f32(f32_to_fp16(v)) } else { v };
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::simd::detected_level() >= crate::simd::Level::Avx512 {
        // SAFETY: AVX-512F/BW are present (the detected level); the lengths are checked above.
        unsafe { split_row_avx512(x, to_f16, hi, lo) };
        done = x.len() / 16 * 16;
    }
    hi[2 * done..n].fill(0);
    lo[2 * done..n].fill(0);
    for (k, &v) in x.iter().enumerate().skip(done) {
        let (h, l) = split(round(v));
        hi[2 * k..2 * k + 2].copy_from_slice(&h.to_le_bytes());
        lo[2 * k..2 * k + 2].copy_from_slice(&l.to_le_bytes());
    }
}

/// `exp` of every value in place (16 lanes at a time on AVX-512: glibc's algorithm, within
/// an ulp of the scalar function everywhere).
pub fn exp_in_place(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::detected_level() >= crate::simd::Level::Avx512 {
        for c in x.chunks_mut(16) {
            // SAFETY: AVX-512F is present (the detected level; AVX2 and FMA come with it).
            unsafe { super::x86::expf::exp_slice(c) };
        }
        return;
    }
    x.iter_mut().for_each(|v| *v = v.exp());
}

/// [`split_row`]'s whole 16-value runs: `vcvtps2ph` where `to_f16` (round to nearest even, as
/// F16C and ggml's conversion) and back to f32, then [`split`]'s integer rounding on 16 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn split_row_avx512(x: &[f32], to_f16: bool, hi: &mut [u8], lo: &mut [u8]) {
    use std::arch::x86_64::*;
    let (one, bias, top) = (_mm512_set1_epi32(1), _mm512_set1_epi32(0x7fff), _mm512_set1_epi32(0xffff_0000u32 as i32));
    for c in 0..x.len() / 16 {
        let v = _mm512_loadu_ps(x.as_ptr().add(c * 16));
        let h = if to_f16 { _mm512_cvtph_ps(_mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v)) } else { v };
        let b = _mm512_castps_si512(h);
        let r = _mm512_add_epi32(_mm512_add_epi32(b, bias), _mm512_and_si512(_mm512_srli_epi32::<16>(b), one));
        let hi32 = _mm512_and_si512(r, top);
        let lo32 = _mm512_castps_si512(_mm512_sub_ps(h, _mm512_castsi512_ps(hi32)));
        _mm256_storeu_si256(hi.as_mut_ptr().add(c * 32) as *mut __m256i, _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(hi32)));
        _mm256_storeu_si256(lo.as_mut_ptr().add(c * 32) as *mut __m256i, _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(lo32)));
    }
}

/// The tile configuration of this thread while it lives (`ldtilecfg`; `tilerelease` on drop):
/// eight tiles of 16 rows x 64 bytes. Only made where [`available`]; not `Send` (the
/// configuration belongs to the thread).
pub struct Tiles(std::marker::PhantomData<*const ()>);

/// `ldtilecfg`'s 64-byte operand.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl Tiles {
    /// Configure this thread's tiles; None where the matrix units are not [`available`].
    pub fn new() -> Option<Tiles> {
        if !available() {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let mut c = TileConfig([0; 64]);
            c.0[0] = 1; // palette 1
            for t in 0..8 {
                c.0[16 + 2 * t..18 + 2 * t].copy_from_slice(&64u16.to_le_bytes());
                c.0[48 + t] = TILE as u8;
            }
            // SAFETY: the CPU has AMX and the process its permission (`available`); the
            // configuration is valid for palette 1.
            unsafe { std::arch::asm!("ldtilecfg [{c}]", c = in(reg) c.0.as_ptr(), options(nostack, readonly)) };
            Some(Tiles(std::marker::PhantomData))
        }
        #[cfg(not(target_arch = "x86_64"))]
        None
    }

    /// `c[j * 2 + g]` (16 tokens x 16 rows, f32, row-major by token) for the token tiles
    /// `j` = 0, 1 (the first 32 rows of the activation matrices `ah`, `al`, `sa` bytes apart)
    /// and the weight groups `g` = 0, 1 (`w0`, `w1`: packed groups), over `kb` blocks of inputs
    /// from the slices' starts; added to `c` where `acc` (a later range of blocks: the sums go
    /// on in the same order as in one call), else from zero.
    ///
    /// # Panics
    /// Where the slices are shorter than the tiles read from them.
    #[allow(clippy::too_many_arguments)]
    pub fn block_2x2(&self, ah: &[u8], al: &[u8], sa: usize, kb: usize, w0: &[u8], w1: &[u8], acc: bool, c: &mut [[f32; TILE * TILE]; 4]) {
        assert!(sa >= kb * 64 && ah.len() >= 31 * sa + kb * 64 && al.len() >= 31 * sa + kb * 64, "amx block: short activations");
        assert!(w0.len() >= kb * 2 * TILE_BYTES && w1.len() >= kb * 2 * TILE_BYTES, "amx block: short weights");
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the tiles are configured (`self`); every tile read lies inside the slices
        // (asserted: 16 rows of 64 bytes at stride `sa` from each activation tile's start,
        // 1 KB per weight tile), and `c` holds the four 1 KB tiles loaded and stored.
        unsafe {
            use std::arch::asm;
            if acc {
                asm!(
                    "tileloadd tmm0, [{c} + {s64}*1]",
                    "tileloadd tmm1, [{c} + {s64}*1 + 1024]",
                    "tileloadd tmm2, [{c} + {s64}*1 + 2048]",
                    "tileloadd tmm3, [{c} + {s64}*1 + 3072]",
                    c = in(reg) c.as_ptr(),
                    s64 = in(reg) 64usize,
                    options(nostack, readonly),
                );
            } else {
                asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
            }
            let (a0h, a0l, a1h, a1l) = (ah.as_ptr(), al.as_ptr(), ah.as_ptr().add(16 * sa), al.as_ptr().add(16 * sa));
            for b in 0..kb {
                asm!(
                    "tileloadd tmm4, [{w0} + {s64}*1]",
                    "tileloadd tmm5, [{w1} + {s64}*1]",
                    "tileloadd tmm6, [{a0h} + {sa}*1]",
                    "tileloadd tmm7, [{a0l} + {sa}*1]",
                    "tdpbf16ps tmm0, tmm6, tmm4",
                    "tdpbf16ps tmm1, tmm6, tmm5",
                    "tdpbf16ps tmm0, tmm7, tmm4",
                    "tdpbf16ps tmm1, tmm7, tmm5",
                    "tileloadd tmm6, [{a1h} + {sa}*1]",
                    "tileloadd tmm7, [{a1l} + {sa}*1]",
                    "tdpbf16ps tmm2, tmm6, tmm4",
                    "tdpbf16ps tmm3, tmm6, tmm5",
                    "tdpbf16ps tmm2, tmm7, tmm4",
                    "tdpbf16ps tmm3, tmm7, tmm5",
                    // the weights' lo tiles: the second token tile's hi is still in tmm6
                    "tileloadd tmm4, [{w0} + {s64}*1 + 1024]",
                    "tileloadd tmm5, [{w1} + {s64}*1 + 1024]",
                    "tdpbf16ps tmm2, tmm6, tmm4",
                    "tdpbf16ps tmm3, tmm6, tmm5",
                    "tileloadd tmm6, [{a0h} + {sa}*1]",
                    "tdpbf16ps tmm0, tmm6, tmm4",
                    "tdpbf16ps tmm1, tmm6, tmm5",
                    w0 = in(reg) w0.as_ptr().add(b * 2 * TILE_BYTES),
                    w1 = in(reg) w1.as_ptr().add(b * 2 * TILE_BYTES),
                    a0h = in(reg) a0h.add(b * 64),
                    a0l = in(reg) a0l.add(b * 64),
                    a1h = in(reg) a1h.add(b * 64),
                    a1l = in(reg) a1l.add(b * 64),
                    sa = in(reg) sa,
                    s64 = in(reg) 64usize,
                    options(nostack, readonly),
                );
            }
            asm!(
                "tilestored [{c} + {s64}*1], tmm0",
                "tilestored [{c} + {s64}*1 + 1024], tmm1",
                "tilestored [{c} + {s64}*1 + 2048], tmm2",
                "tilestored [{c} + {s64}*1 + 3072], tmm3",
                c = in(reg) c.as_mut_ptr(),
                s64 = in(reg) 64usize,
                options(nostack),
            );
        }
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the tiles were configured by `new` on this thread (`Tiles` is not `Send`).
        unsafe {
            std::arch::asm!("tilerelease", options(nostack, nomem))
        };
    }
}

/// The plain twin: `out[t * n_out + r] = sum_k f16(x[t][k]) w[r][k]` in f64, rounded to f32
/// (`w`: `n_out` F16 rows of `n_in`).
pub fn matmul_reference(x: &[f32], n_in: usize, w: &[u8], n_out: usize, n_tok: usize, out: &mut [f32]) {
    assert!(x.len() >= n_tok * n_in && w.len() >= n_out * n_in * 2 && out.len() >= n_tok * n_out);
    for t in 0..n_tok {
        let xr: Vec<f64> = x[t * n_in..(t + 1) * n_in].iter().map(|&v| fp16_to_f32(f32_to_fp16(v)) as f64).collect();
        for r in 0..n_out {
            let row = &w[r * n_in * 2..(r + 1) * n_in * 2];
            let s: f64 = xr.iter().zip(row.chunks_exact(2)).map(|(&a, h)| a * fp16_to_f32(u16::from_le_bytes([h[0], h[1]])) as f64).sum();
            out[t * n_out + r] = s as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_f16_value_is_the_sum_of_its_two_halves() {
        for bits in (0u16..0x7c00).step_by(7).chain([0x3c00, 0x3bff, 0x0001, 0x03ff, 0x7bff]) {
            for sign in [0u16, 0x8000] {
                let v = fp16_to_f32(bits | sign);
                let (h, l) = split(v);
                let (h, l) = (f32::from_bits((h as u32) << 16), f32::from_bits((l as u32) << 16));
                assert_eq!(h + l, v, "f16 {bits:#06x}");
                assert!(l.abs() <= h.abs() / 256.0, "f16 {bits:#06x}: lo {l} hi {h}");
            }
        }
    }
}
