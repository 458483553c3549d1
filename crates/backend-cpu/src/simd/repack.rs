//! Interleaved ("repacked") weights for the 32-element block types Q4_0 and IQ4_NL (Q4_K in
//! `repack_k.rs`), and the float order their matmul uses (the order of llama.cpp's x86
//! `block_q4_0x8` kernels).
//!
//! Weights are repacked once (on the first matmul of a tensor) into groups of [`R`] rows:
//! for each 32-element block, the 16 rows' codes are interleaved 4 bytes at a time, so one
//! 512-bit register holds the same 4-element group of all 16 rows and `vpdpbusd` with a
//! broadcast 4-byte activation group gives the 16 rows' partial sums in 16 lanes: no
//! horizontal sums, and a block's integer dot product of every row is exact.
//!
//! ```text
//!  group of 16 rows, block b:  codes (k = 0..4, 64 B each: lane i = row i's qs[4k..4k+4];
//!                                      low nibbles = elements 4k.., high = 16+4k..)
//!                            | d: 16 f16
//!  per (row, token):   acc = 0;  per block:  acc = fma(f32(isum), d_w * d_a, acc)
//! ```
//!
//! `isum` is the exact integer dot product of the block (Q4_0: `Σ (q-8)·y`, IQ4_NL:
//! `Σ kvalues[q]·y`). Q4_0's order is llama.cpp's repacked one (`acc = fma(cvt(iacc),
//! col_scale * row_scale, acc)`), so results are bit-identical to llama.cpp's for the same
//! quantized activations. Every output depends only on its own row and token, whatever
//! the batch: batched == alone, bit for bit. [`reference_dot`] is the scalar twin the SIMD
//! kernels (`x86/repack.rs`) are tested against (exactly equal).

use quarrel_core::QuantType;

/// Rows per interleaved group.
pub const R: usize = 16;
const QK: usize = 32;

/// A weight type with a repacked form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum RepackTy {
    Q4_0,
    /// 256-element super-blocks; layout and order in `repack_k.rs`.
    Q4_K,
    /// Q4_0's layout; codes are indices into `KVALUES_IQ4NL`.
    IQ4_NL,
}

impl RepackTy {
    pub fn of(ty: QuantType) -> Option<RepackTy> {
        match ty {
            QuantType::Q4_0 => Some(RepackTy::Q4_0),
            QuantType::Q4_K => Some(RepackTy::Q4_K),
            QuantType::IQ4_NL => Some(RepackTy::IQ4_NL),
            _ => None,
        }
    }

    /// Bytes of one GGUF weight block / one activation block (Q8_0, Q8_K for Q4_K).
    pub fn wb(self) -> usize {
        match self {
            RepackTy::Q4_0 | RepackTy::IQ4_NL => 18,
            RepackTy::Q4_K => super::repack_k::WB,
        }
    }

    pub fn ab(self) -> usize {
        match self {
            RepackTy::Q4_K => super::repack_k::AB,
            _ => 34,
        }
    }

    /// Elements per block.
    pub fn qk(self) -> usize {
        if self == RepackTy::Q4_K {
            super::repack_k::QK
        } else {
            QK
        }
    }

    /// Bytes of the codes of one block of a group.
    pub fn codes(self) -> usize {
        match self {
            RepackTy::Q4_K => super::repack_k::CODES,
            _ => 16 * R,
        }
    }

    /// Bytes of one block of a group (codes, d).
    pub fn group_block(self) -> usize {
        if self == RepackTy::Q4_K {
            return super::repack_k::GROUP_BLOCK;
        }
        self.codes() + 2 * R
    }

    /// Bytes of one group of `R` rows of `n_in` values.
    pub fn group_bytes(self, n_in: usize) -> usize {
        n_in / self.qk() * self.group_block()
    }
}

/// Offset of the codes within a GGUF weight block and within an activation block (Q8_0).
const CODES_AT: usize = 2;

/// Repack `n_out` GGUF rows of `n_in` values (`src`, rows back to back) into
/// `ceil(n_out / R)` groups (missing rows of the last group are zeros, scales 0).
pub fn repack(ty: RepackTy, n_in: usize, n_out: usize, src: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; n_out.div_ceil(R) * ty.group_bytes(n_in)];
    repack_into(ty, n_in, n_out, src, &mut out);
    out
}

/// [`repack`] into `out` (`ceil(n_out / R)` groups, zeroed by the caller): the pieces of
/// one weight can be repacked in parallel, a whole number of groups each.
pub fn repack_into(ty: RepackTy, n_in: usize, n_out: usize, src: &[u8], out: &mut [u8]) {
    if ty == RepackTy::Q4_K {
        return super::repack_k::repack_into(n_in, n_out, src, out);
    }
    let c = ty.codes();
    for_each_block(n_in, n_out, src, out, (QK, ty.wb(), ty.group_block()), |i, s, d| {
        let q = &s[CODES_AT..];
        for k in 0..c / (4 * R) {
            for j in 0..4 {
                d[k * 4 * R + 4 * i + j] = q[4 * k + j];
            }
        }
        d[c + 2 * i..c + 2 * i + 2].copy_from_slice(&s[0..2]);
    });
}

/// `place(i, block, group block)` for every block of the `n_out` rows of `src`: row `r` is
/// row `i = r % R` of group `r / R`. `(qk, wb, gb)`: values per block, bytes of a source
/// block and of a group block.
pub(crate) fn for_each_block(
    n_in: usize,
    n_out: usize,
    src: &[u8],
    out: &mut [u8],
    (qk, wb, gb): (usize, usize, usize),
    mut place: impl FnMut(usize, &[u8], &mut [u8]),
) {
    let nb = n_in / qk;
    assert!(n_in.is_multiple_of(qk) && src.len() >= n_out * nb * wb, "repack: short source");
    assert!(out.len() >= n_out.div_ceil(R) * nb * gb, "repack: short output");
    for (r, row) in src.chunks_exact(nb * wb).take(n_out).enumerate() {
        let (g, i) = (r / R, r % R);
        for b in 0..nb {
            place(i, &row[b * wb..(b + 1) * wb], &mut out[(g * nb + b) * gb..(g * nb + b + 1) * gb]);
        }
    }
}

fn f16(b: &[u8], o: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[o], b[o + 1]])).to_f32()
}

/// Per-(token, block) activation terms the kernels read besides the codes: the integer
/// correction `off` (Q4_0: `-8·Σy`, IQ4_NL: `-128·Σy`) and `d_a`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(C)]
pub struct ActAux {
    pub off: i32,
    pub d: f32,
    /// (keeps the struct 32 bytes)
    pub _pad: [i32; 2],
    /// Q4_K: the sums of the 8 sub-blocks' activation codes.
    pub bs: [i16; 8],
}

/// The [`ActAux`] of each of the `n_in / 32` blocks of one quantized activation row.
pub fn act_aux(ty: RepackTy, n_in: usize, a: &[u8], out: &mut [ActAux]) {
    if ty == RepackTy::Q4_K {
        return super::repack_k::act_aux(n_in, a, out);
    }
    let (nb, ab) = (n_in / QK, ty.ab());
    assert!(a.len() >= nb * ab && out.len() >= nb);
    for (b, o) in out[..nb].iter_mut().enumerate() {
        let blk = &a[b * ab..(b + 1) * ab];
        let sy: i32 = blk[CODES_AT..CODES_AT + QK].iter().map(|&v| v as i8 as i32).sum();
        *o = ActAux {
            off: match ty {
                RepackTy::Q4_0 => -8 * sy,
                // (the SIMD kernels' codes are `value + 128`)
                _ => -128 * sy,
            },
            d: f16(blk, 0),
            _pad: [0; 2],
            bs: [0; 8],
        };
    }
}

/// The [`ActAux`] of every row of `acts`, quantized activation rows of `row_bytes` each.
pub fn act_aux_rows(ty: RepackTy, n_in: usize, acts: &[u8], row_bytes: usize) -> Vec<Vec<ActAux>> {
    acts.chunks(row_bytes)
        .map(|a| {
            let mut v = vec![ActAux::default(); n_in / ty.qk()];
            act_aux(ty, n_in, a, &mut v);
            v
        })
        .collect()
}

/// The scalar twin: row `i` (0..R) of the group at `group` against one activation row `a`
/// (the weight's vec_dot_type), in the order described in the module header.
pub fn reference_dot(ty: RepackTy, n_in: usize, group: &[u8], i: usize, a: &[u8]) -> f32 {
    if ty == RepackTy::Q4_K {
        return super::repack_k::reference_dot(n_in, group, i, a);
    }
    let (nb, gb, ab) = (n_in / QK, ty.group_block(), ty.ab());
    let mut aux = vec![ActAux::default(); nb];
    act_aux(ty, n_in, a, &mut aux);
    let mut acc = 0f32;
    for b in 0..nb {
        let g = &group[b * gb..(b + 1) * gb];
        let y = &a[b * ab + CODES_AT..b * ab + CODES_AT + QK];
        let mut isum = aux[b].off;
        for k in 0..ty.codes() / (4 * R) {
            for j in 0..4 {
                let c = g[k * 4 * R + 4 * i + j];
                if ty == RepackTy::IQ4_NL {
                    let kv = |q: u8| quarrel_quant::nonlinear::KVALUES_IQ4NL[q as usize] as i32 + 128;
                    isum += kv(c & 15) * y[4 * k + j] as i8 as i32;
                    isum += kv(c >> 4) * y[16 + 4 * k + j] as i8 as i32;
                } else {
                    isum += (c & 15) as i32 * y[4 * k + j] as i8 as i32;
                    isum += (c >> 4) as i32 * y[16 + 4 * k + j] as i8 as i32;
                }
            }
        }
        let c = ty.codes();
        acc = (isum as f32).mul_add(f16(g, c + 2 * i) * aux[b].d, acc);
    }
    acc
}

/// Whether the repacked matmul runs for `ty` on this CPU: where AVX2 kernels run (AVX-512
/// VNNI ones where the level allows), for Q4_0, Q4_K and IQ4_NL: the types llama.cpp's x86
/// build repacks, so this is also llama.cpp's float order (Q4_1 and Q8_0 keep ggml's
/// vec_dot order, as llama.cpp does not repack them on x86). [`crate::tuning::set_repack`]
/// turns the path off for tests.
pub fn enabled(ty: QuantType) -> Option<RepackTy> {
    let t = RepackTy::of(ty)?;
    if !crate::tuning::repack_on() || !kernels_available() {
        return None;
    }
    Some(t)
}

/// Whether the SIMD kernels can run here (at the level `QUARREL_SIMD` allows): AVX-512
/// VNNI kernels at that level, AVX2 twins (the same bits) at `Avx2` / `Avx512`.
pub fn kernels_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::detected_level() >= super::Level::Avx2 && super::Level::Avx2.is_supported()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Tokens of one tile call.
pub const TILE_TOKENS: usize = 8;

/// `out[t][i]` for the `R` rows of `group` and the `acts.len()` (1..=[`TILE_TOKENS`])
/// activation rows: the SIMD kernel where [`kernels_available`], else [`reference_dot`].
pub fn tile(ty: RepackTy, n_in: usize, group: &[u8], acts: &[(&[u8], &[ActAux])], out: &mut [[f32; R]]) {
    tile_for(super::detected_level(), ty, n_in, group, acts, out)
}

/// [`tile`] with the kernels of `level` (AVX-512 VNNI at `Avx512Vnni`, AVX2 at `Avx2` and
/// `Avx512`; [`reference_dot`] at `Scalar` or where the CPU lacks the level): every level
/// gives the same bits.
pub fn tile_for(level: super::Level, ty: RepackTy, n_in: usize, group: &[u8], acts: &[(&[u8], &[ActAux])], out: &mut [[f32; R]]) {
    assert!(!acts.is_empty() && acts.len() <= TILE_TOKENS && out.len() >= acts.len());
    #[cfg(target_arch = "x86_64")]
    if level >= super::Level::Avx2 && level.is_supported() {
        super::x86::repack::tile(level >= super::Level::Avx512Vnni, ty, n_in, group, acts, out);
        return;
    }
    let _ = level;
    for (t, (a, _)) in acts.iter().enumerate() {
        for i in 0..R {
            out[t][i] = reference_dot(ty, n_in, group, i, a);
        }
    }
}
