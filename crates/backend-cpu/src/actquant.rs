//! Activation quantization as ggml's x86 build does it: `id = 127 / amax` and round half to
//! even (`_mm256_round_ps(_MM_ROUND_NEAREST)`), which differs in the last bit from ggml's
//! scalar reference (`id = 1 / d`, `roundf`). Matching it is what keeps our logits within
//! float rounding of llama.cpp's on x86. Q8_K has no x86 variant in ggml: the reference is used.

use quarrel_core::{CoreError, QuantType, Result};

/// Quantize one row of activations to `ty` (the weight's vec_dot_type).
pub fn quantize_row(ty: QuantType, x: &[f32], out: &mut [u8]) -> Result<()> {
    match ty {
        QuantType::Q8_0 => q8(x, out, 34, false),
        QuantType::Q8_1 => q8(x, out, 36, true),
        _ => Ok(quarrel_quant::quantize(ty, x, out)?),
    }
}

fn f16_bits(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

fn q8(x: &[f32], out: &mut [u8], block_bytes: usize, with_sum: bool) -> Result<()> {
    if !x.len().is_multiple_of(32) || out.len() != x.len() / 32 * block_bytes {
        return Err(CoreError::Shape(format!("q8 activation row of {} values into {} bytes", x.len(), out.len())));
    }
    let qoff = if with_sum { 4 } else { 2 };
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(block_bytes)) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (o, &v) in ob[qoff..].iter_mut().zip(xb) {
            let q = (v * id).round_ties_even() as i32;
            sum += q;
            *o = q as i8 as u8;
        }
        ob[0..2].copy_from_slice(&f16_bits(d));
        if with_sum {
            ob[2..4].copy_from_slice(&f16_bits(d * sum as f32));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_to_the_reference_quantizer() {
        let x: Vec<f32> = (0..256).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013).collect();
        for ty in [QuantType::Q8_0, QuantType::Q8_1] {
            let n = ty.row_bytes(x.len()).unwrap();
            let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
            quantize_row(ty, &x, &mut a).unwrap();
            quarrel_quant::quantize(ty, &x, &mut b).unwrap();
            let (mut da, mut db) = (vec![0f32; 256], vec![0f32; 256]);
            quarrel_quant::dequantize(ty, &a, &mut da).unwrap();
            quarrel_quant::dequantize(ty, &b, &mut db).unwrap();
            // the two differ at most by one quantization step on ties
            for (u, v) in da.iter().zip(&db) {
                assert!((u - v).abs() <= 0.66 * 0.013 * 50.0 / 127.0 * 1.01 + 1e-6, "{u} vs {v}");
            }
        }
    }

    #[test]
    fn ties_round_to_even() {
        // amax 127 => id 1: 2.5 -> 2, 3.5 -> 4, -2.5 -> -2
        let mut x = vec![0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = 3.5;
        x[3] = -2.5;
        let mut o = vec![0u8; 34];
        quantize_row(QuantType::Q8_0, &x, &mut o).unwrap();
        assert_eq!((o[3] as i8, o[4] as i8, o[5] as i8), (2, 4, -2));
    }
}
