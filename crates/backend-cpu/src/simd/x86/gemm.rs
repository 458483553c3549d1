//! The GEMM kernel families behind `simd::Gemm`: `gemm_ggml` (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
//! in llama.cpp's order, AVX-512 VNNI), `gemm_kquants` (Q4_K, Q5_K, Q6_K in the order of
//! the AVX-512 one-row kernels) and `gemm_float` (F16, AVX2 or AVX-512, in the order of the
//! one-row kernel of the same width); `gemm_wide` adds 16-token tiles for the first family.

use super::{gemm_float, gemm_ggml, gemm_kquants};
use crate::simd::{Level, GEMM_ROWS, GEMM_TOKENS};
use quarrel_core::QuantType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Ggml(gemm_ggml::Ty),
    /// `bool`: the `vpdpwssd` flavour.
    KQuant(gemm_kquants::Ty, bool),
    /// F16 weights; `bool`: AVX-512 (else AVX2).
    F16(bool),
}

impl Kind {
    /// The kernels matching the one-row kernel of `level` for `ty` (as `x86::dot_fn` picks
    /// it, or `ggml_order` for the llama.cpp-order types at `Level::Avx2`), if the CPU has
    /// what they need. `ggml_order`: whether the one-row kernel is the `ggml_order` one.
    pub(crate) fn for_level(ty: QuantType, level: Level, ggml_order: bool) -> Option<Kind> {
        if ty == QuantType::F16 && super::has_avx2() {
            // the one-row kernel's width: float::dot_fn_avx512 from Level::Avx512 on
            return match level {
                Level::Avx512 | Level::Avx512Vnni if super::has_avx512() => Some(Kind::F16(true)),
                Level::Avx2 => Some(Kind::F16(false)),
                _ => None,
            };
        }
        if !super::has_avx2() || !super::has_avx512() {
            return None;
        }
        let vnni = super::has_avx512vnni();
        let k = match (ty, ggml_order) {
            (QuantType::Q4_0, true) => Kind::Ggml(gemm_ggml::Ty::Q4_0),
            (QuantType::Q4_1, true) => Kind::Ggml(gemm_ggml::Ty::Q4_1),
            (QuantType::Q8_0, true) => Kind::Ggml(gemm_ggml::Ty::Q8_0),
            (QuantType::Q5_0, true) => Kind::Ggml(gemm_ggml::Ty::Q5_0),
            (QuantType::Q5_1, true) => Kind::Ggml(gemm_ggml::Ty::Q5_1),
            (QuantType::Q4_K, false) => Kind::KQuant(gemm_kquants::Ty::Q4K, false),
            (QuantType::Q5_K, false) => Kind::KQuant(gemm_kquants::Ty::Q5K, false),
            (QuantType::Q6_K, false) => Kind::KQuant(gemm_kquants::Ty::Q6K, false),
            _ => return None,
        };
        match k {
            Kind::Ggml(_) => (vnni && gemm_ggml::supported()).then_some(k),
            // the one-row kernels of both AVX-512 levels accumulate alike; use VNNI where
            // the level allows it
            Kind::KQuant(t, _) if level >= Level::Avx512 => Some(Kind::KQuant(t, vnni && level >= Level::Avx512Vnni)),
            Kind::KQuant(..) | Kind::F16(_) => None,
        }
    }

    pub(crate) fn min_tokens(self) -> usize {
        match self {
            Kind::Ggml(_) => 2,
            Kind::KQuant(..) => 3,
            Kind::F16(_) => 2,
        }
    }

    pub(crate) fn raw_panels(self) -> bool {
        matches!(self, Kind::KQuant(..) | Kind::F16(_))
    }

    pub(crate) fn act_panel_bytes(self, n_in: usize) -> usize {
        match self {
            Kind::Ggml(t) => t.act_panel_bytes(n_in),
            Kind::KQuant(t, _) => t.act_panel_bytes(n_in),
            Kind::F16(_) => gemm_float::act_panel_bytes(n_in),
        }
    }

    pub(crate) fn weight_panel_bytes(self, n_in: usize) -> usize {
        match self {
            Kind::Ggml(t) => t.weight_panel_bytes(n_in),
            Kind::KQuant(t, _) => t.weight_panel_bytes(n_in),
            Kind::F16(_) => gemm_float::weight_panel_bytes(n_in),
        }
    }

    pub(crate) fn pack_act(self, n_in: usize, rows: &[&[u8]], panel: &mut [u8]) {
        match self {
            Kind::Ggml(t) => t.pack_act(n_in, rows, panel),
            Kind::KQuant(t, _) => t.pack_act(n_in, rows, panel),
            Kind::F16(_) => gemm_float::pack_act(n_in, rows, panel),
        }
    }

    pub(crate) fn pack_weights(self, n_in: usize, rows: &[&[u8]], panel: &mut [u8]) {
        match self {
            Kind::Ggml(t) => t.pack_weights(n_in, rows, panel),
            Kind::KQuant(t, _) => t.pack_weights(n_in, rows, panel),
            Kind::F16(_) => gemm_float::pack(n_in, rows, GEMM_ROWS, panel),
        }
    }

    /// Bytes of a compact kept panel (`gemm_compact`), None where panels are kept as the
    /// tiles read them.
    pub(crate) fn compact_panel_bytes(self, n_in: usize) -> Option<usize> {
        match self {
            Kind::Ggml(t) if t.compact() => Some(t.compact_panel_bytes(n_in)),
            _ => None,
        }
    }

    /// Panics for a kind without compact panels.
    pub(crate) fn pack_weights_compact(self, n_in: usize, rows: &[&[u8]], panel: &mut [u8]) {
        match self {
            Kind::Ggml(t) => t.pack_weights_compact(n_in, rows, panel),
            _ => panic!("no compact panels for {self:?}"),
        }
    }

    /// Panics for a kind without compact panels.
    pub(crate) fn expand_panel(self, n_in: usize, compact: &[u8], panel: &mut [u8]) {
        match self {
            Kind::Ggml(t) if t.compact() => t.expand_panel(n_in, compact, panel),
            _ => panic!("no compact panels for {self:?}"),
        }
    }

    /// Whether the kind has 16-token tiles (`gemm_wide`).
    pub(crate) fn has_wide(self) -> bool {
        matches!(self, Kind::Ggml(_))
    }

    pub(crate) fn wide_act_panel_bytes(self, n_in: usize) -> usize {
        match self {
            Kind::Ggml(t) => t.wide_act_panel_bytes(n_in),
            _ => 0,
        }
    }

    /// Panics for a kind without wide tiles.
    pub(crate) fn pack_act_wide(self, n_in: usize, rows: &[&[u8]], panel: &mut [u8]) {
        match self {
            Kind::Ggml(t) => t.pack_act_wide(n_in, rows, panel),
            _ => panic!("no wide GEMM tiles for {self:?}"),
        }
    }

    /// Panics for a kind without wide tiles.
    pub(crate) fn tile_wide(self, n_in: usize, w: &[u8], a: &[u8], n_tok: usize, out: &mut [f32], ld: usize) {
        match self {
            Kind::Ggml(t) => t.tile_wide(n_in, w, a, n_tok, out, ld),
            _ => panic!("no wide GEMM tiles for {self:?}"),
        }
    }

    /// `out[r][t]` for `t < n_tok`; other entries of `out` are left as they are.
    pub(crate) fn tile(self, n_in: usize, w: &[u8], a: &[u8], n_tok: usize, out: &mut [[f32; GEMM_TOKENS]; GEMM_ROWS]) {
        match self {
            Kind::Ggml(t) => t.tile(n_in, w, a, n_tok, out),
            Kind::KQuant(t, vnni) => t.tile(vnni, n_in, w, a, n_tok, out),
            Kind::F16(avx512) => gemm_float::tile(avx512, n_in, w, a, n_tok, out),
        }
    }
}
