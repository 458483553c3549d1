//! GELU as llama.cpp's CPU backend computes it: the tanh approximation evaluated once per f16
//! input into a 65,536-entry table (`ggml_table_gelu_f16`), looked up after rounding the input to
//! f16; inputs at or below -10 give 0 and at or above 10 pass through. Backends share this table
//! (the CUDA backend uploads it), so every backend's GELU has the CPU's bits.

use quarrel_quant::{f32_to_fp16, fp16_to_f32};
use std::sync::OnceLock;

const GELU_COEF_A: f32 = 0.044715;
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// `0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x²)))` in f32, in ggml's operation order.
pub fn gelu_f32(x: f32) -> f32 {
    // ggml-cpu.c is built with FMA and GCC contracts `1 + a·x·x` into one fused multiply-add
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (GELU_COEF_A * x).mul_add(x, 1.0)).tanh())
}

/// f16 bits of GELU for every f16 input bit pattern.
pub fn gelu_table() -> &'static [u16] {
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(|h| f32_to_fp16(gelu_f32(fp16_to_f32(h)))).collect())
}

/// GELU of one value through the table (ggml_vec_gelu_f32 with GGML_GELU_FP16).
#[inline]
pub fn gelu(x: f32, table: &[u16]) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        fp16_to_f32(table[f32_to_fp16(x) as usize])
    }
}

/// `out[i] = gelu(gate[i]) * up[i]` (ggml_vec_geglu_f32: the table's value times `up`; at or
/// above 10 the gate itself times `up`).
pub fn geglu_ref(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let t = gelu_table();
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = if g <= -10.0 { 0.0 } else { gelu(g, t) * u };
    }
}

/// `x = gelu(x)` in place (ggml_vec_gelu_f32: the table's value; at or above 10 the input).
pub fn gelu_ref(x: &mut [f32]) {
    let t = gelu_table();
    x.iter_mut().for_each(|v| *v = gelu(*v, t));
}

/// GPT-OSS's clamped SwiGLU (ggml_swiglu_oai): `x = min(gate, limit)`,
/// `y = clamp(up, -limit, limit)`, `out = x / (1 + exp(-alpha x)) * (y + 1)`.
pub fn swiglu_oai_ref(gate: &[f32], up: &[f32], out: &mut [f32], alpha: f32, limit: f32) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let x = g.min(limit);
        let y = u.clamp(-limit, limit);
        *o = x / (1.0 + (alpha * -x).exp()) * (y + 1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swiglu_oai_clamps() {
        let mut o = [0f32; 3];
        swiglu_oai_ref(&[100.0, 0.0, 1.0], &[-100.0, 5.0, 100.0], &mut o, 1.702, 7.0);
        // gate clamped to 7, up to -7: 7·σ(1.702·7)·(-6)
        assert!((o[0] - 7.0 / (1.0 + (-1.702f32 * 7.0).exp()) * -6.0).abs() < 1e-5);
        assert_eq!(o[1], 0.0);
        assert!((o[2] - 1.0 / (1.0 + (-1.702f32).exp()) * 8.0).abs() < 1e-5);
    }

    #[test]
    fn table_follows_the_formula() {
        let t = gelu_table();
        assert_eq!(t.len(), 65_536);
        for x in [-9.5f32, -3.0, -1.0, -0.5, 0.0, 0.25, 1.0, 2.0, 7.75] {
            let want = fp16_to_f32(f32_to_fp16(gelu_f32(x)));
            assert_eq!(gelu(x, t), want, "x = {x}");
        }
        assert_eq!(gelu(-10.0, t), 0.0);
        assert_eq!(gelu(12.5, t), 12.5);
        // gelu(x) - gelu(-x) = x
        for x in [0.5f32, 1.5, 3.0] {
            assert!((gelu_f32(x) - gelu_f32(-x) - x).abs() < 1e-6);
        }
    }

    #[test]
    fn geglu_multiplies_by_up() {
        let g = [-20.0, -1.0, 0.0, 1.0, 20.0];
        let u = [3.0, 2.0, 5.0, -1.0, 0.5];
        let mut o = [0.0; 5];
        geglu_ref(&g, &u, &mut o);
        assert_eq!(o[0], 0.0);
        assert_eq!(o[2], 0.0);
        assert_eq!(o[4], 10.0);
        assert_eq!(o[3], -gelu(1.0, gelu_table()));
    }
}

#[cfg(test)]
mod llama_cpp {
    use super::*;

    /// The table against llama.cpp's own (scripts/gelu_table.c: ggml_gelu on every f16 input in
    /// (-10, 10), in bit-pattern order), bit for bit.
    #[test]
    fn table_equals_llama_cpp() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/act/gelu_f16_table.bin");
        let bytes = std::fs::read(path).expect("fixture tests/fixtures/act/gelu_f16_table.bin");
        let want: Vec<u16> = bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        let t = gelu_table();
        let ours: Vec<u16> = (0..=u16::MAX)
            .filter(|&h| {
                let v = fp16_to_f32(h);
                v > -10.0 && v < 10.0
            })
            .map(|h| t[h as usize])
            .collect();
        assert_eq!(ours.len(), want.len());
        let differ: Vec<usize> = (0..ours.len()).filter(|&i| ours[i] != want[i]).collect();
        assert!(differ.is_empty(), "{} of {} entries differ from llama.cpp's, first at {:?}", differ.len(), ours.len(), differ.first());
    }
}
