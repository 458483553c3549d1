//! Run-time dispatched SIMD dot products of a weight row with a quantized activation row,
//! and SIMD quantizers for the activation types.
//!
//! Every kernel here has a reference twin in `quarrel-quant` (`quarrel_quant::vec_dot`,
//! `quarrel_quant::quantize`), and `tests/simd_*.rs` compare them on random data at every
//! [`Level`] the CPU supports.
//!
//! ```text
//!  Level::Avx2        AVX2+FMA+F16C       every weight type (dot + dot4 for 32-blocks),
//!                                         Q8_0/Q8_1/Q8_K quantizers (both flavours)
//!  Level::Avx512      + AVX512F/BW/VL     512-bit kernels for every weight type
//!  Level::Avx512Vnni  + AVX512-VNNI       vpdpbusd (32-element blocks), vpdpwssd (K-quants)
//! ```
//!
//! A level without its own kernel for a type falls back to the next lower level's kernel.
//!
//! [`Gemm`] ([`gemm_fn`]): prompt-processing tiles of [`GEMM_ROWS`] weight rows x
//! [`GEMM_TOKENS`] tokens whose every output has the bits of [`dot_fn`]'s kernel for the
//! type (AVX-512: Q4_0, Q4_1, Q8_0, Q5_0, Q5_1 with VNNI; Q4_K, Q5_K, Q6_K);
//! `tests/gemm_vs_dot.rs` checks that bit for bit.
//! `QUARREL_SIMD=scalar|avx2|avx512|avx512vnni` caps the level picked by [`dot_fn`],
//! [`dot4_fn`] and the quantizers (read once, in [`crate::tuning`]).
//! On other architectures everything compiles to "no kernel" (callers use the reference).
//!
//! [`repack`]: Q4_0, Q4_K and IQ4_NL weights (AVX2 / AVX-512 VNNI) are interleaved into 16-row groups
//! on first use and run one kernel for any token count, with one float FMA per output per
//! block (llama.cpp's repacked order for Q4_0 / Q4_K); `matmul` takes that path first.
//!
//! Results: integer block sums are exact; only the float accumulation order differs from
//! the reference (float types: f32 FMA accumulation instead of the reference's f64).

pub mod amx;
pub mod attn;
pub mod repack;
mod repack_k;
#[cfg(target_arch = "x86_64")]
mod x86;

use quarrel_core::QuantType;
use std::sync::OnceLock;

/// `dot(n, w_row, a_row)`: `a_row` is `n` activations in `w`'s vec_dot_type.
pub type DotFn = fn(usize, &[u8], &[u8]) -> f32;

/// `dot4(n, [w_row; 4], a_row) -> [f32; 4]`: four weight rows of the same type against one
/// activation row (shares the activation loads and scale conversions between the rows).
pub type Dot4Fn = fn(usize, [&[u8]; 4], &[u8]) -> [f32; 4];

/// `quantize(src, dst)`: `src.len()` f32 to `dst` bytes of an activation type
/// (`dst.len() == ty.row_bytes(src.len())`, else it panics).
pub type QuantizeRowFn = fn(&[f32], &mut [u8]);

/// An instruction-set level with its own kernel set. Ordered: a higher level implies the
/// features of the lower ones (on the same architecture).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Level {
    /// No SIMD kernels (the `quarrel-quant` reference is used).
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 level plus AVX512F + AVX512BW + AVX512VL.
    Avx512,
    /// AVX512 level plus AVX512-VNNI.
    Avx512Vnni,
}

impl Level {
    /// Every level, lowest first.
    pub const ALL: &'static [Level] = &[Level::Scalar, Level::Avx2, Level::Avx512, Level::Avx512Vnni];

    /// Short lowercase name (the `QUARREL_SIMD` spelling).
    pub fn name(self) -> &'static str {
        match self {
            Level::Scalar => "scalar",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
            Level::Avx512Vnni => "avx512vnni",
        }
    }

    /// Parse a `QUARREL_SIMD` value.
    pub fn from_name(s: &str) -> Option<Level> {
        Level::ALL.iter().copied().find(|l| l.name().eq_ignore_ascii_case(s.trim()))
    }

    /// Whether this CPU can run the kernels of this level.
    pub fn is_supported(self) -> bool {
        match self {
            Level::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => x86::has_avx2(),
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => x86::has_avx2() && x86::has_avx512(),
            #[cfg(target_arch = "x86_64")]
            Level::Avx512Vnni => x86::has_avx2() && x86::has_avx512() && x86::has_avx512vnni(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

/// Every level this CPU supports, lowest first (always starts with `Scalar`).
pub fn available_levels() -> Vec<Level> {
    Level::ALL.iter().copied().filter(|l| l.is_supported()).collect()
}

/// The best level this CPU supports, capped by `QUARREL_SIMD` ([`crate::tuning`]).
pub fn detected_level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let best = available_levels().last().copied().unwrap_or(Level::Scalar);
        crate::tuning::get().simd_cap.map_or(best, |cap| cap.min(best))
    })
}

/// CPU features the kernels use, as a short string for logs (ends with the selected level).
pub fn features_string() -> String {
    #[cfg(target_arch = "x86_64")]
    let f = x86::feature_names();
    #[cfg(not(target_arch = "x86_64"))]
    let f: Vec<&str> = vec![];
    let base = if f.is_empty() { "scalar".to_string() } else { f.join("+") };
    format!("{base}; kernels: {}", detected_level().name())
}

/// The fastest kernel for this weight type on this CPU, or None (use the reference).
pub fn dot_fn(ty: QuantType) -> Option<DotFn> {
    #[cfg(target_arch = "x86_64")]
    if matmul_level(ty) == Level::Avx2 && Level::Avx2.is_supported() {
        if let Some(f) = x86::ggml_order::dot_fn(ty) {
            return Some(f);
        }
    }
    dot_fn_for(ty, matmul_level(ty))
}

/// The level the matmul uses for `ty`. llama.cpp's x86 build runs the legacy 32-element types
/// through its AVX2 kernels even on AVX-512 machines; our AVX2 kernels accumulate in the same
/// float order, so their results are bit-identical to llama.cpp's (and greedy texts agree).
/// The wider kernels reorder the float sums, so they are used only where that parity is not
/// at stake. `QUARREL_SIMD` still caps the level.
pub fn matmul_level(ty: QuantType) -> Level {
    let detected = detected_level();
    let legacy = matches!(ty, QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q5_0 | QuantType::Q5_1 | QuantType::Q8_0);
    if legacy && detected > Level::Avx2 {
        Level::Avx2
    } else {
        detected
    }
}

/// `$x86` (an x86 kernel of `$level` for `$ty`) where `$level` is a SIMD level this CPU
/// supports, else None.
macro_rules! at_level {
    ($level:expr, $ty:expr, $x86:expr) => {{
        if $level == Level::Scalar || !$level.is_supported() {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        {
            $x86
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = $ty;
            None
        }
    }};
}

/// The kernel of `level` for `ty` (falling back to a lower level's kernel where `level` has
/// none of its own), or None if the CPU lacks `level` or no SIMD kernel exists for `ty`.
pub fn dot_fn_for(ty: QuantType, level: Level) -> Option<DotFn> {
    at_level!(level, ty, x86::dot_fn(ty, level))
}

/// Four-row kernel for `ty` at the detected level, or None (call the one-row kernel 4 times).
pub fn dot4_fn(ty: QuantType) -> Option<Dot4Fn> {
    // the llama.cpp-order kernels have their own four-row form (bit-identical per row)
    #[cfg(target_arch = "x86_64")]
    if matmul_level(ty) == Level::Avx2 && Level::Avx2.is_supported() && x86::ggml_order::dot_fn(ty).is_some() {
        return x86::ggml_order::dot4_fn(ty);
    }
    dot4_fn_for(ty, matmul_level(ty))
}

/// Four-row kernel of `level` for `ty` (see [`dot_fn_for`]).
pub fn dot4_fn_for(ty: QuantType, level: Level) -> Option<Dot4Fn> {
    at_level!(level, ty, x86::dot4_fn(ty, level))
}

/// SIMD quantizer for an activation type (`Q8_0`, `Q8_1`, `Q8_K`) at the detected level,
/// or None (use `quarrel_quant::quantize`). Output bytes are identical to the reference
/// (`quarrel_quant::quantize`: `id = 1 / d`, `roundf`) for finite inputs.
pub fn quantize_row_fn(ty: QuantType) -> Option<QuantizeRowFn> {
    quantize_row_fn_for(ty, detected_level())
}

/// The quantizer of `level` for `ty` (see [`dot_fn_for`]).
pub fn quantize_row_fn_for(ty: QuantType, level: Level) -> Option<QuantizeRowFn> {
    at_level!(level, ty, x86::quantize_row_fn(ty, level, false))
}

/// SIMD quantizer with the rounding of ggml's x86 build for `Q8_0` / `Q8_1`
/// (`id = 127 / amax`, round half to even: the bytes of [`crate::actquant::quantize_row`]);
/// `Q8_K` as [`quantize_row_fn`] (ggml's x86 build uses the reference for it). None: use
/// `actquant::quantize_row`.
pub fn quantize_row_fn_ggml_x86(ty: QuantType) -> Option<QuantizeRowFn> {
    quantize_row_fn_ggml_x86_for(ty, detected_level())
}

/// [`quantize_row_fn_ggml_x86`] at `level` (see [`dot_fn_for`]).
pub fn quantize_row_fn_ggml_x86_for(ty: QuantType, level: Level) -> Option<QuantizeRowFn> {
    at_level!(level, ty, x86::quantize_row_fn(ty, level, true))
}

/// `gemv8(n, w, row_bytes, a, out)`: the [`dot_fn`] results of the [`GEMV_ROWS`] weight rows
/// that start at `w` (`row_bytes` apart) with the activation row `a` (`n` values), bit for
/// bit; faster than [`dot4_fn`] twice (decode).
pub type Gemv8Fn = fn(usize, &[u8], usize, &[u8], &mut [f32; GEMV_ROWS]);

/// Rows of one [`Gemv8Fn`] call.
pub const GEMV_ROWS: usize = 8;

/// The eight-row decode kernel matching [`dot_fn`]`(ty)`, or None: Q4_0, Q4_1 and Q8_0
/// (llama.cpp-order kernels) where the detected level is `Avx512Vnni`.
pub fn gemv8_fn(ty: QuantType) -> Option<Gemv8Fn> {
    #[cfg(target_arch = "x86_64")]
    {
        use x86::gemv_ggml::{self as g, Ty};
        let ggml_order = matmul_level(ty) == Level::Avx2 && Level::Avx2.is_supported() && x86::ggml_order::dot_fn(ty).is_some();
        if !ggml_order || detected_level() < Level::Avx512Vnni || !g::supported() {
            return None;
        }
        Some(match ty {
            QuantType::Q4_0 => |n, w, rb, a, out| g::gemv8(Ty::Q4_0, n, w, rb, a, out),
            QuantType::Q4_1 => |n, w, rb, a, out| g::gemv8(Ty::Q4_1, n, w, rb, a, out),
            QuantType::Q8_0 => |n, w, rb, a, out| g::gemv8(Ty::Q8_0, n, w, rb, a, out),
            _ => return None,
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        None
    }
}

/// Reference dot through `quarrel-quant` (the twin of every SIMD kernel).
pub fn reference_dot(ty: QuantType, n: usize, w: &[u8], a: &[u8]) -> f32 {
    quarrel_quant::vec_dot(ty, w, a, n).unwrap_or(f32::NAN)
}

/// Weight rows of one [`Gemm::tile`].
pub const GEMM_ROWS: usize = 4;
/// Tokens of one [`Gemm::tile`] (and of one activation panel).
pub const GEMM_TOKENS: usize = 8;
/// Tokens of one [`Gemm::tile_wide`] (and of one wide activation panel).
pub const GEMM_WIDE_TOKENS: usize = 16;

/// GEMM micro-kernels for one weight type (prompt processing): a tile of [`GEMM_ROWS`]
/// weight rows x [`GEMM_TOKENS`] tokens whose every output has exactly the bits of the
/// one-row kernel [`dot_fn`] picks for that type (it only shares loads and unpacking work
/// between outputs). Both operands are repacked into panels first ([`Gemm::pack_act`],
/// [`Gemm::pack_weights`]); panels should be 64-byte aligned (any alignment is correct).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemm {
    #[cfg(target_arch = "x86_64")]
    kind: x86::gemm::Kind,
    #[cfg(not(target_arch = "x86_64"))]
    never: std::convert::Infallible,
}

/// The GEMM kernels matching [`dot_fn`]`(ty)`, or None (use [`dot_fn`] per output). There
/// are kernels for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (llama.cpp-order one-row kernels) where the
/// detected level (after the `QUARREL_SIMD` cap) is `Avx512Vnni`, for Q4_K, Q5_K and Q6_K
/// where [`matmul_level`] is `Avx512` or above, and for F16 from `Avx2` on.
pub fn gemm_fn(ty: QuantType) -> Option<Gemm> {
    #[cfg(target_arch = "x86_64")]
    {
        let level = matmul_level(ty);
        let ggml_order = level == Level::Avx2 && Level::Avx2.is_supported() && x86::ggml_order::dot_fn(ty).is_some();
        // the legacy types' kernels (AVX2 level) get 512-bit VNNI tiles: only where the cap
        // allows those instructions
        if level == Level::Avx2 && detected_level() < Level::Avx512Vnni && ty != QuantType::F16 {
            return None;
        }
        x86::gemm::Kind::for_level(ty, level, ggml_order).map(|kind| Gemm { kind })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        None
    }
}

#[cfg(target_arch = "x86_64")]
impl Gemm {
    /// Fewest tokens for which the tiles beat the one-row kernels (measured; the panels'
    /// repacking costs about one pass over the weights).
    pub fn min_tokens(&self) -> usize {
        self.kind.min_tokens()
    }

    /// Whether weight panels are the rows' own bytes one after another: then [`GEMM_ROWS`]
    /// consecutive weight rows of a tensor can be passed to [`Gemm::tile`] without packing
    /// (packing copies them). Activation panels are always packed ([`Gemm::pack_act`]).
    pub fn raw_panels(&self) -> bool {
        self.kind.raw_panels()
    }

    /// Bytes of an activation panel ([`GEMM_TOKENS`] rows of `n_in` values; a multiple of 64).
    pub fn act_panel_bytes(&self, n_in: usize) -> usize {
        self.kind.act_panel_bytes(n_in)
    }

    /// Bytes of a weight panel ([`GEMM_ROWS`] rows of `n_in` values; a multiple of 64).
    pub fn weight_panel_bytes(&self, n_in: usize) -> usize {
        self.kind.weight_panel_bytes(n_in)
    }

    /// Repack up to [`GEMM_TOKENS`] activation rows (quantized to the weight type's
    /// vec_dot_type) into `panel` (missing rows become zeros). Panics on short buffers.
    pub fn pack_act(&self, n_in: usize, rows: &[&[u8]], panel: &mut [u8]) {
        self.kind.pack_act(n_in, rows, panel)
    }

    /// Bytes of a *compact* weight panel where kept panels are compact (Q4_0, Q4_1: half the
    /// bytes, [`Gemm::expand_panel`] before the tiles), else None.
    pub fn compact_panel_bytes(&self, n_in: usize) -> Option<usize> {
        self.kind.compact_panel_bytes(n_in)
    }

    /// Up to [`GEMM_ROWS`] weight rows into a compact panel (missing rows become zeros).
    /// Panics on short buffers or for a kind without compact panels.
    pub fn pack_weights_compact(&self, n_in: usize, rows: &[&[u8]], panel: &mut [u8]) {
        self.kind.pack_weights_compact(n_in, rows, panel)
    }

    /// A compact panel into `panel` ([`Gemm::weight_panel_bytes`]): exactly the bytes
    /// [`Gemm::pack_weights`] gives for the same rows. Panics on short buffers or for a kind
    /// without compact panels.
    pub fn expand_panel(&self, n_in: usize, compact: &[u8], panel: &mut [u8]) {
        self.kind.expand_panel(n_in, compact, panel)
    }

    /// Repack up to [`GEMM_ROWS`] weight rows into `panel` (missing rows become zeros).
    /// Panics on short buffers.
    pub fn pack_weights(&self, n_in: usize, rows: &[&[u8]], panel: &mut [u8]) {
        self.kind.pack_weights(n_in, rows, panel)
    }

    /// `out[r][t]` = the one-row kernel's dot of the panels' weight row `r` and token `t`,
    /// for `t < n_tok` (1..=[`GEMM_TOKENS`]); other entries are left as they are.
    pub fn tile(&self, n_in: usize, w_panel: &[u8], a_panel: &[u8], n_tok: usize, out: &mut [[f32; GEMM_TOKENS]; GEMM_ROWS]) {
        self.kind.tile(n_in, w_panel, a_panel, n_tok, out)
    }

    /// Whether there are wide tiles ([`GEMM_WIDE_TOKENS`] tokens over the same weight
    /// panels, fewer instructions per product; Q4_0, Q4_1, Q8_0).
    pub fn has_wide(&self) -> bool {
        self.kind.has_wide()
    }

    /// Bytes of a wide activation panel (a multiple of 64); 0 without wide tiles.
    pub fn wide_act_panel_bytes(&self, n_in: usize) -> usize {
        self.kind.wide_act_panel_bytes(n_in)
    }

    /// [`Gemm::pack_act`] for up to [`GEMM_WIDE_TOKENS`] rows into a wide panel. Panics on
    /// short buffers or without wide tiles ([`Gemm::has_wide`]).
    pub fn pack_act_wide(&self, n_in: usize, rows: &[&[u8]], panel: &mut [u8]) {
        self.kind.pack_act_wide(n_in, rows, panel)
    }

    /// [`Gemm::tile`] over a wide activation panel (`n_tok` in 1..=[`GEMM_WIDE_TOKENS`]),
    /// the same bits per output, written token-major: `out[t * ld + r]` for `t < n_tok`,
    /// `r <` [`GEMM_ROWS`] (other entries are left as they are). Panics without wide tiles
    /// or if `ld < GEMM_ROWS` or `out` is shorter than `(n_tok - 1) * ld + GEMM_ROWS`.
    pub fn tile_wide(&self, n_in: usize, w_panel: &[u8], a_panel: &[u8], n_tok: usize, out: &mut [f32], ld: usize) {
        self.kind.tile_wide(n_in, w_panel, a_panel, n_tok, out, ld)
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl Gemm {
    pub fn min_tokens(&self) -> usize {
        match self.never {}
    }
    pub fn raw_panels(&self) -> bool {
        match self.never {}
    }
    pub fn act_panel_bytes(&self, _: usize) -> usize {
        match self.never {}
    }
    pub fn weight_panel_bytes(&self, _: usize) -> usize {
        match self.never {}
    }
    pub fn pack_act(&self, _: usize, _: &[&[u8]], _: &mut [u8]) {
        match self.never {}
    }
    pub fn compact_panel_bytes(&self, _: usize) -> Option<usize> {
        match self.never {}
    }
    pub fn pack_weights_compact(&self, _: usize, _: &[&[u8]], _: &mut [u8]) {
        match self.never {}
    }
    pub fn expand_panel(&self, _: usize, _: &[u8], _: &mut [u8]) {
        match self.never {}
    }
    pub fn pack_weights(&self, _: usize, _: &[&[u8]], _: &mut [u8]) {
        match self.never {}
    }
    pub fn tile(&self, _: usize, _: &[u8], _: &[u8], _: usize, _: &mut [[f32; GEMM_TOKENS]; GEMM_ROWS]) {
        match self.never {}
    }
    pub fn has_wide(&self) -> bool {
        match self.never {}
    }
    pub fn wide_act_panel_bytes(&self, _: usize) -> usize {
        match self.never {}
    }
    pub fn pack_act_wide(&self, _: usize, _: &[&[u8]], _: &mut [u8]) {
        match self.never {}
    }
    pub fn tile_wide(&self, _: usize, _: &[u8], _: &[u8], _: usize, _: &mut [f32], _: usize) {
        match self.never {}
    }
}
