//! Property tests of the validating API: arbitrary sizes, arbitrary floats
//! (NaN/inf included) and arbitrary bytes never panic; wrong sizes are
//! rejected with the right error; sane inputs give sane outputs.

use proptest::prelude::*;
use quarrel_quant::{dequantize, quantize, vec_dot, QuantError, QuantType};

fn any_type() -> impl Strategy<Value = QuantType> {
    (0..QuantType::ALL.len()).prop_map(|i| QuantType::ALL[i])
}

/// Any f32 bit pattern, biased towards ordinary values and zeros.
fn any_f32() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => -10.0f32..10.0,
        1 => Just(0.0f32),
        1 => any::<u32>().prop_map(f32::from_bits),
        1 => prop::sample::select(vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN_POSITIVE, -0.0, 1e-40]),
    ]
}

/// (type, element count that is a whole number of blocks, up to 4 K-blocks)
fn type_and_len() -> impl Strategy<Value = (QuantType, usize)> {
    any_type().prop_flat_map(|ty| {
        let bs = ty.block_size();
        let max_blocks = if bs == 1 { 300 } else { 1024 / bs };
        (Just(ty), (0..=max_blocks).prop_map(move |b| b * bs))
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_values_never_panic((ty, n) in type_and_len(), seed in any::<u64>(), pool in prop::collection::vec(any_f32(), 1..64)) {
        // Fill n values from the pool deterministically (cheap for long rows).
        let x: Vec<f32> = (0..n).map(|i| pool[(i as u64).wrapping_mul(seed | 1) as usize % pool.len()]).collect();
        let bytes = ty.row_bytes(n).unwrap();
        let mut q = vec![0u8; bytes];
        quantize(ty, &x, &mut q).unwrap();
        let mut y = vec![0f32; n];
        dequantize(ty, &q, &mut y).unwrap();

        let vdt = ty.vec_dot_type();
        let mut a = vec![0u8; vdt.row_bytes(n).unwrap()];
        quantize(vdt, &x, &mut a).unwrap();
        match vec_dot(ty, &q, &a, n) {
            Ok(_) => {}
            Err(QuantError::Unsupported { .. }) => prop_assert!(matches!(ty, QuantType::Q8_1 | QuantType::Q8_K)),
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }

    #[test]
    fn arbitrary_bytes_dequantize_and_dot((ty, n) in type_and_len(), seed in any::<u64>()) {
        let bytes = ty.row_bytes(n).unwrap();
        let mut state = seed;
        let mut next = || { state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (state >> 56) as u8 };
        let raw: Vec<u8> = (0..bytes).map(|_| next()).collect();
        let mut y = vec![0f32; n];
        dequantize(ty, &raw, &mut y).unwrap();
        let vdt = ty.vec_dot_type();
        let a: Vec<u8> = (0..vdt.row_bytes(n).unwrap()).map(|_| next()).collect();
        let _ = vec_dot(ty, &raw, &a, n);
    }

    #[test]
    fn sane_inputs_give_bounded_outputs((ty, n) in type_and_len(), vals in prop::collection::vec(-100.0f32..100.0, 1..64), scale_exp in -8i32..8) {
        let s = 2f32.powi(scale_exp);
        let x: Vec<f32> = (0..n).map(|i| vals[i % vals.len()] * s).collect();
        let mut q = vec![0u8; ty.row_bytes(n).unwrap()];
        quantize(ty, &x, &mut q).unwrap();
        let mut y = vec![0f32; n];
        dequantize(ty, &q, &mut y).unwrap();
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (i, v) in y.iter().enumerate() {
            prop_assert!(v.is_finite(), "{ty}: y[{i}] = {v}");
            prop_assert!(v.abs() <= 4.0 * amax + 1e-3, "{ty}: y[{i}] = {v}, amax {amax}");
        }
        if ty == QuantType::F32 {
            prop_assert_eq!(&x, &y);
        }
    }

    #[test]
    fn wrong_sizes_are_errors((ty, n) in type_and_len(), delta in 1usize..40, grow in any::<bool>()) {
        let bytes = ty.row_bytes(n).unwrap();
        let bad_bytes = if grow { bytes + delta } else { bytes.saturating_sub(delta) };
        if bad_bytes != bytes {
            let mut y = vec![0f32; n];
            let e = dequantize(ty, &vec![0u8; bad_bytes], &mut y).unwrap_err();
            prop_assert!(matches!(e, QuantError::BufferSize { expected, got, .. } if expected == bytes && got == bad_bytes), "{}", e);
            let e = quantize(ty, &y, &mut vec![0u8; bad_bytes]).unwrap_err();
            prop_assert!(matches!(e, QuantError::BufferSize { .. }), "{e}");
        }
        let bs = ty.block_size();
        if bs > 1 {
            let bad_n = n + delta % bs;
            if bad_n % bs != 0 {
                let mut y = vec![0f32; bad_n];
                prop_assert!(matches!(dequantize(ty, &vec![0u8; bytes], &mut y), Err(QuantError::NotBlockMultiple { .. })), "dequantize {}", ty);
                prop_assert!(matches!(quantize(ty, &y, &mut vec![0u8; bytes]), Err(QuantError::NotBlockMultiple { .. })), "quantize {}", ty);
                prop_assert!(vec_dot(ty, &vec![0u8; bytes], &[], bad_n).is_err());
                prop_assert_eq!(ty.row_bytes(bad_n), None);
            }
        }
        // activation buffer of the wrong size
        let vdt = ty.vec_dot_type();
        let abytes = vdt.row_bytes(n).unwrap();
        let r = vec_dot(ty, &vec![0u8; bytes], &vec![0u8; abytes + delta], n);
        prop_assert!(r.is_err());
        if !matches!(ty, QuantType::Q8_1 | QuantType::Q8_K) {
            prop_assert!(matches!(r, Err(QuantError::BufferSize { what: "activation", .. })), "{:?}", r);
            prop_assert!(vec_dot(ty, &vec![0u8; bytes], &vec![0u8; abytes], n).is_ok());
        }
    }
}

#[test]
fn huge_counts_do_not_overflow() {
    for &ty in QuantType::ALL {
        let n = usize::MAX / ty.block_size() * ty.block_size();
        if ty.type_size() > ty.block_size() {
            // only types with more bytes than elements per block can overflow
            assert_eq!(ty.row_bytes(n), None, "{ty}");
            assert!(matches!(vec_dot(ty, &[], &[], n), Err(QuantError::Overflow { .. } | QuantError::Unsupported { .. })));
        }
    }
}
