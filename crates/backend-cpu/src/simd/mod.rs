//! Run-time dispatched SIMD dot products of a weight row with a quantized activation row.
//!
//! Every kernel here has a reference twin in `quarrel-quant` (`quarrel_quant::vec_dot`), and
//! `tests/simd_vs_reference.rs` compares them on random data.

#[cfg(target_arch = "x86_64")]
mod x86;

use quarrel_core::QuantType;

/// `dot(n, w_row, a_row)`: `a_row` is `n` activations in `w`'s vec_dot_type.
pub type DotFn = fn(usize, &[u8], &[u8]) -> f32;

/// CPU features the kernels use, as a short string for logs.
pub fn features_string() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let mut f = vec![];
        if std::arch::is_x86_feature_detected!("avx2") {
            f.push("avx2");
        }
        if std::arch::is_x86_feature_detected!("fma") {
            f.push("fma");
        }
        if std::arch::is_x86_feature_detected!("f16c") {
            f.push("f16c");
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            f.push("avx512f");
        }
        if std::arch::is_x86_feature_detected!("avx512vnni") {
            f.push("avx512vnni");
        }
        if f.is_empty() {
            "scalar".into()
        } else {
            f.join("+")
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        "scalar".into()
    }
}

/// The fastest kernel for this weight type on this CPU, or None (use the reference).
pub fn dot_fn(ty: QuantType) -> Option<DotFn> {
    if std::env::var_os("QUARREL_NO_SIMD").is_some() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            return x86::dot_fn_avx2(ty);
        }
    }
    let _ = ty;
    None
}

/// Reference dot through `quarrel-quant` (the twin of every SIMD kernel).
pub fn reference_dot(ty: QuantType, n: usize, w: &[u8], a: &[u8]) -> f32 {
    quarrel_quant::vec_dot(ty, w, a, n).unwrap_or(f32::NAN)
}
