//! AVX2 + FMA + F16C kernels for the K-quants (256-element super-blocks) against Q8_K.
//!
//! Per super-block: expand 32 weights at a time to unsigned bytes, `vpmaddubsw` them with
//! the Q8_K bytes (i16 pair sums, no saturation: codes are <= 63), `vpmaddwd` the pairs with
//! the sub-block scales (i32), and accumulate in integers; the super-block scale is applied
//! once in f32. Offsets (Q2_K/Q4_K/Q5_K mins, the Q6_K -32, the Q3_K -4) use the Q8_K
//! `bsums` or a second `vpmaddubsw`.

use super::*;

kquant_table!(pub(super));

pub(crate) const QK_K: usize = 256;
/// Q8_K block: `{ f32 d; i8 qs[256]; i16 bsums[16] }`.
pub(crate) const Q8K_BYTES: usize = 292;
pub(crate) const Q8K_QS: usize = 4;
pub(crate) const Q8K_BSUMS: usize = 260;

const fn make_pair_shuffles() -> [[u8; 32]; 4] {
    let mut t = [[0u8; 32]; 4];
    let mut k = 0;
    while k < 4 {
        let mut b = 0;
        while b < 32 {
            // low lane: i16 element 2k; high lane: element 2k + 1
            let e = if b < 16 { 2 * k } else { 2 * k + 1 };
            t[k][b] = (2 * e + (b & 1)) as u8;
            b += 1;
        }
        k += 1;
    }
    t
}

const fn make_one_shuffles() -> [[u8; 32]; 8] {
    let mut t = [[0u8; 32]; 8];
    let mut k = 0;
    while k < 8 {
        let mut b = 0;
        while b < 32 {
            t[k][b] = (2 * k + (b & 1)) as u8;
            b += 1;
        }
        k += 1;
    }
    t
}

static PAIR_SHUFFLES: [[u8; 32]; 4] = make_pair_shuffles();
static ONE_SHUFFLES: [[u8; 32]; 8] = make_one_shuffles();

/// `vpshufb` control that broadcasts i16 element `2k` to the low 128-bit lane and `2k + 1`
/// to the high lane (of a vector holding the same 8 i16 in both lanes). `k < 4`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn pair_shuffle(k: usize) -> __m256i {
    // SAFETY: the table row is 32 readable bytes.
    unsafe { _mm256_loadu_si256(PAIR_SHUFFLES[k].as_ptr() as *const __m256i) }
}

/// `vpshufb` control broadcasting i16 element `k` to every lane (same 8 i16 in both
/// lanes). `k < 8`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn one_shuffle(k: usize) -> __m256i {
    // SAFETY: the table row is 32 readable bytes.
    unsafe { _mm256_loadu_si256(ONE_SHUFFLES[k].as_ptr() as *const __m256i) }
}

/// The Q4_K / Q5_K 12-byte scale field unpacked to `[sc0..sc8, m0..m8]` (6-bit values).
#[inline(always)]
pub(crate) unsafe fn k4_scales_mins(p: *const u8) -> [u32; 4] {
    const KMASK1: u32 = 0x3f3f3f3f;
    const KMASK2: u32 = 0x0f0f0f0f;
    const KMASK3: u32 = 0x03030303;
    let u0 = std::ptr::read_unaligned(p as *const u32);
    let u1 = std::ptr::read_unaligned(p.add(4) as *const u32);
    let u2 = std::ptr::read_unaligned(p.add(8) as *const u32);
    [u0 & KMASK1, (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4), u1 & KMASK1, ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4)]
}

/// The start of a Q4_K / Q5_K super-block `x` against the Q8_K block `y`: the mins' term
/// (`dmin · Σ m · bsums`) added to `acc_m`; returns `d` and the scales and mins as i16
/// (`[sc0..sc8, m0..m8]`).
/// SAFETY: AVX2+FMA+F16C; `x` holds the block's first 16 bytes, `y` a whole Q8_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn k4_block_start(x: *const u8, y: *const u8, acc_m: &mut __m128) -> (f32, __m256i) {
    let yd = f32_at(y);
    let d = yd * f16_at(x);
    let dmin = -yd * f16_at(x.add(2));
    let u = k4_scales_mins(x.add(4));
    let ms = _mm256_cvtepu8_epi16(_mm_setr_epi32(u[0] as i32, u[1] as i32, u[2] as i32, u[3] as i32));
    let q8sums = _mm256_loadu_si256(y.add(Q8K_BSUMS) as *const __m256i);
    let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256(q8sums, 1));
    let prod = _mm_madd_epi16(_mm256_extracti128_si256(ms, 1), q8s);
    *acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), *acc_m);
    (d, ms)
}

/// `sumi` plus chunk `j` of a Q4_K / Q5_K super-block: the low (`lo`) and high (`hi`) 32
/// codes times their 64 Q8_K bytes of `y`, times their sub-block scales.
/// SAFETY: AVX2+FMA+F16C; `y` a whole Q8_K block; `j < 4`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_chunk(sumi: __m256i, scales: __m256i, j: usize, lo: __m256i, hi: __m256i, y: *const u8) -> __m256i {
    let q8 = y.add(Q8K_QS + 64 * j);
    let q8l = _mm256_loadu_si256(q8 as *const __m256i);
    let q8h = _mm256_loadu_si256(q8.add(32) as *const __m256i);
    let pl = _mm256_madd_epi16(_mm256_shuffle_epi8(scales, one_shuffle(2 * j)), _mm256_maddubs_epi16(lo, q8l));
    let ph = _mm256_madd_epi16(_mm256_shuffle_epi8(scales, one_shuffle(2 * j + 1)), _mm256_maddubs_epi16(hi, q8h));
    _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph))
}

/// The Q3_K 12-byte scale field unpacked to 16 signed scales (`s - 32`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q3k_scales(p: *const u8) -> __m128i {
    const KMASK1: u32 = 0x03030303;
    const KMASK2: u32 = 0x0f0f0f0f;
    let a0 = std::ptr::read_unaligned(p as *const u32);
    let a1 = std::ptr::read_unaligned(p.add(4) as *const u32);
    let a2 = std::ptr::read_unaligned(p.add(8) as *const u32);
    let s = _mm_setr_epi32(
        ((a0 & KMASK2) | ((a2 & KMASK1) << 4)) as i32,
        ((a1 & KMASK2) | (((a2 >> 2) & KMASK1) << 4)) as i32,
        (((a0 >> 4) & KMASK2) | (((a2 >> 4) & KMASK1) << 4)) as i32,
        (((a1 >> 4) & KMASK2) | (((a2 >> 6) & KMASK1) << 4)) as i32,
    );
    _mm_sub_epi8(s, _mm_set1_epi8(32))
}

/// The super-block loop of a K-quant dot: `block(x, y)` for each `wb`-byte weight block `x`
/// (prefetched) and its Q8_K block `y`, in order. SAFETY: AVX2+FMA+F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn for_blocks(n: usize, w: &[u8], wb: usize, a: &[u8], mut block: impl FnMut(*const u8, *const u8)) {
    let nb = n / QK_K;
    check_len(nb, w, wb, a, Q8K_BYTES);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    for i in 0..nb {
        let (x, y) = (wp.add(i * wb), ap.add(i * Q8K_BYTES));
        prefetch(x, wb);
        block(x, y);
    }
}

/// Q2_K · Q8_K. Block: `scales[16] @0, qs[64] @16, d @80, dmin @82`. SAFETY: AVX2+FMA+F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q2_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm_set1_epi8(0xF);
    let mut acc = _mm256_setzero_ps();
    for_blocks(n, w, 84, a, |x, y| {
        let yd = f32_at(y);
        let d = yd * f16_at(x.add(80));
        let dmin = -yd * f16_at(x.add(82));
        let sm = _mm_loadu_si128(x as *const __m128i);
        let mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), m4));
        let prod = _mm256_madd_epi16(mins, _mm256_loadu_si256(y.add(Q8K_BSUMS) as *const __m256i));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc);
        let all = _mm256_cvtepi8_epi16(_mm_and_si128(sm, m4));
        let (l, h) = (_mm256_castsi256_si128(all), _mm256_extracti128_si256(all, 1));
        let scales = [_mm256_set_m128i(l, l), _mm256_set_m128i(h, h)];
        let mut sumi = _mm256_setzero_si256();
        for (j, sc) in scales.iter().enumerate() {
            let q2bits = _mm256_loadu_si256(x.add(16 + 32 * j) as *const __m256i);
            let q8 = y.add(Q8K_QS + 128 * j);
            let mut bits = q2bits;
            for k in 0..4 {
                let q2 = _mm256_and_si256(bits, m3);
                bits = _mm256_srli_epi16(bits, 2);
                let q8k = _mm256_loadu_si256(q8.add(32 * k) as *const __m256i);
                let p = _mm256_maddubs_epi16(q2, q8k);
                let p = _mm256_madd_epi16(_mm256_shuffle_epi8(*sc, pair_shuffle(k)), p);
                sumi = _mm256_add_epi32(sumi, p);
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    });
    hsum_ps(acc)
}

/// Q3_K · Q8_K. Block: `hmask[32] @0, qs[64] @32, scales[12] @96, d @108`.
/// Code = 2 low bits - (4 if the hmask bit is clear). SAFETY: AVX2+FMA+F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q3_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm256_set1_epi8(4);
    let mut acc = _mm256_setzero_ps();
    for_blocks(n, w, 110, a, |x, y| {
        let d = f32_at(y) * f16_at(x.add(108));
        let all = _mm256_cvtepi8_epi16(q3k_scales(x.add(96)));
        let (l, h) = (_mm256_castsi256_si128(all), _mm256_extracti128_si256(all, 1));
        let scales = [_mm256_set_m128i(l, l), _mm256_set_m128i(h, h)];
        let mut hbits = _mm256_loadu_si256(x as *const __m256i);
        let mut sumi = _mm256_setzero_si256();
        for (j, sc) in scales.iter().enumerate() {
            let mut bits = _mm256_loadu_si256(x.add(32 + 32 * j) as *const __m256i);
            let q8 = y.add(Q8K_QS + 128 * j);
            for k in 0..4 {
                let ql = _mm256_and_si256(bits, m3);
                bits = _mm256_srli_epi16(bits, 2);
                // 4 where the high bit (bit 0 of hbits, shifted to bit 2) is clear
                let qh = _mm256_andnot_si256(_mm256_slli_epi16(hbits, 2), m4);
                hbits = _mm256_srli_epi16(hbits, 1);
                let q8k = _mm256_loadu_si256(q8.add(32 * k) as *const __m256i);
                let p = _mm256_sub_epi16(_mm256_maddubs_epi16(ql, q8k), _mm256_maddubs_epi16(qh, q8k));
                let p = _mm256_madd_epi16(_mm256_shuffle_epi8(*sc, pair_shuffle(k)), p);
                sumi = _mm256_add_epi32(sumi, p);
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    });
    hsum_ps(acc)
}

/// Q4_K · Q8_K. Block: `d @0, dmin @2, scales[12] @4, qs[128] @16`. SAFETY: AVX2+FMA+F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_k4::<false>(n, w, a)
}

/// Q5_K · Q8_K. Block: `d @0, dmin @2, scales[12] @4, qh[32] @16, qs[128] @48`.
/// SAFETY: AVX2+FMA+F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q5_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_k4::<true>(n, w, a)
}

/// Q4_K (`Q5` false) or Q5_K (`Q5` true: the fifth bit of each code from `qh`) · Q8_K.
/// SAFETY: AVX2+FMA+F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_k4<const Q5: bool>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (block, nibbles) = if Q5 { (176, 48) } else { (144, 16) };
    let m4 = _mm256_set1_epi8(0xF);
    let m16 = _mm256_set1_epi8(0x10);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for_blocks(n, w, block, a, |x, y| {
        let (d, ms) = k4_block_start(x, y, &mut acc_m);
        let sc = _mm256_castsi256_si128(ms);
        let scales = _mm256_set_m128i(sc, sc);
        let mut hbits = if Q5 { _mm256_loadu_si256(x.add(16) as *const __m256i) } else { _mm256_setzero_si256() };
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let bits = _mm256_loadu_si256(x.add(nibbles + 32 * j) as *const __m256i);
            let mut lo = _mm256_and_si256(bits, m4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            if Q5 {
                // bit 0 of each hbits byte -> bit 4 (the 16s place), then the next bit
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hbits, 4), m16));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hbits, 3), m16));
                hbits = _mm256_srli_epi16(hbits, 2);
            }
            sumi = k4_chunk(sumi, scales, j, lo, hi, y);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    });
    hsum_ps(acc) + hsum_ps128(acc_m)
}

/// Q6_K · Q8_K. Block: `ql[128] @0, qh[64] @128, scales[16] (i8) @192, d @208`.
/// Code = 6-bit unsigned - 32; the -32 is applied through `bsums`. SAFETY: AVX2+FMA+F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q6_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let m15 = _mm256_set1_epi8(15);
    let mut acc = _mm256_setzero_ps();
    for_blocks(n, w, 210, a, |x, y| {
        let d = f32_at(y) * f16_at(x.add(208));
        let q8sums = _mm256_loadu_si256(y.add(Q8K_BSUMS) as *const __m256i);
        let sc8 = _mm_loadu_si128(x.add(192) as *const __m128i);
        let sc16 = _mm256_cvtepi8_epi16(sc8);
        let sub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, sc16), 5);
        let (l, h) = (_mm256_castsi256_si128(sc16), _mm256_extracti128_si256(sc16, 1));
        let scales = [_mm256_set_m128i(l, l), _mm256_set_m128i(h, h)];
        let mut sumi = _mm256_setzero_si256();
        for (j, sc) in scales.iter().enumerate() {
            let ql = x.add(64 * j);
            let q4bits1 = _mm256_loadu_si256(ql as *const __m256i);
            let q4bits2 = _mm256_loadu_si256(ql.add(32) as *const __m256i);
            let hb = _mm256_loadu_si256(x.add(128 + 32 * j) as *const __m256i);
            let h0 = _mm256_slli_epi16(_mm256_and_si256(hb, m3), 4);
            let h1 = _mm256_slli_epi16(_mm256_and_si256(hb, _mm256_set1_epi8(12)), 2);
            let h2 = _mm256_and_si256(hb, _mm256_set1_epi8(48));
            let h3 = _mm256_srli_epi16(_mm256_and_si256(hb, _mm256_set1_epi8(-64)), 2);
            let q = [
                _mm256_or_si256(_mm256_and_si256(q4bits1, m15), h0),
                _mm256_or_si256(_mm256_and_si256(q4bits2, m15), h1),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits1, 4), m15), h2),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits2, 4), m15), h3),
            ];
            let q8 = y.add(Q8K_QS + 128 * j);
            for (k, qk) in q.iter().enumerate() {
                let q8k = _mm256_loadu_si256(q8.add(32 * k) as *const __m256i);
                let p = _mm256_maddubs_epi16(*qk, q8k);
                let p = _mm256_madd_epi16(_mm256_shuffle_epi8(*sc, pair_shuffle(k)), p);
                sumi = _mm256_add_epi32(sumi, p);
            }
        }
        let sumi = _mm256_sub_epi32(sumi, sub);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    });
    hsum_ps(acc)
}
