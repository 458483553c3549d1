//! `quantize`: a tiny synthetic F32 model converted to F16, Q8_0 and Q4_K_M. The output's
//! tensor types follow llama-quantize's mix, its metadata is the input's with the new file
//! type, its data are the input's values in the new type; quantized inputs are refused unless
//! requantizing is allowed, and the output may not overwrite the input.

use quarrel_gguf::{Gguf, QuantType as T, Value};
use quarrel_models::quantize::{check_distinct, write_quantized, QuantizeError, QuantizeOptions, QuantizePlan};
use quarrel_models::Ftype;
use std::path::{Path, PathBuf};

fn tiny_f32(dir: &Path) -> PathBuf {
    let p = dir.join("tiny-f32.gguf");
    quarrel_synth::write_tiny(&p, Ftype::F32, 7).unwrap();
    p
}

fn quantize(input: &Path, out: &Path, ftype: Ftype, opts: QuantizeOptions) -> Result<Gguf, QuantizeError> {
    check_distinct(input, out)?;
    let g = Gguf::open(input)?;
    let plan = QuantizePlan::new(&g, ftype, &opts)?;
    let mut last = 0;
    write_quantized(&g, &plan, out, &mut |p| {
        assert!(p.done > last || p.tensor.out_bytes == 0, "progress only moves forward");
        last = p.done;
    })?;
    assert_eq!(last, plan.out_bytes, "progress ends at the planned size");
    Ok(Gguf::open(out)?)
}

/// The error of a conversion that must fail.
fn fails(input: &Path, out: &Path, ftype: Ftype, opts: QuantizeOptions) -> QuantizeError {
    match quantize(input, out, ftype, opts) {
        Ok(_) => panic!("{} -> {} succeeded", input.display(), out.display()),
        Err(e) => e,
    }
}

fn ty(g: &Gguf, name: &str) -> T {
    g.tensor_info(name).unwrap_or_else(|| panic!("{name} missing")).ty
}

fn values(g: &Gguf, name: &str) -> Vec<f32> {
    let (info, bytes) = g.tensor(name).unwrap();
    quarrel_quant::dequantize_to_vec(info.ty, bytes, info.n_elements() as usize).unwrap()
}

/// Every key of `a` is in `b` with the same value, except the two a conversion sets.
fn assert_metadata_copied(a: &Gguf, b: &Gguf, ftype: Ftype) {
    for (k, v) in a.metadata() {
        if k != "general.file_type" {
            assert_eq!(b.get(k), Some(v), "metadata {k}");
        }
    }
    assert_eq!(b.get("general.file_type"), Some(&Value::U32(ftype.llama_ftype())));
    assert_eq!(b.get_u64("general.quantization_version").unwrap(), Some(2));
    assert_eq!(a.metadata().len(), b.metadata().len());
}

#[test]
fn f32_to_f16_q8_0_q4_k_m() {
    let dir = tempfile::tempdir().unwrap();
    let input = tiny_f32(dir.path());
    let src = Gguf::open(&input).unwrap();
    let names: Vec<String> = src.tensors().iter().map(|t| t.name.clone()).collect();
    assert!(names.len() > 10 && names.iter().any(|n| n == "output.weight"));

    // F16: 2-D tensors are the input's values rounded to f16, 1-D ones keep F32 bits
    let g = quantize(&input, &dir.path().join("f16.gguf"), Ftype::F16, QuantizeOptions::default()).unwrap();
    assert_metadata_copied(&src, &g, Ftype::F16);
    for t in src.tensors() {
        let (out_info, out) = g.tensor(&t.name).unwrap();
        assert_eq!(out_info.dims, t.dims);
        if t.dims.len() == 1 {
            assert_eq!(out_info.ty, T::F32, "{}", t.name);
            assert_eq!(out, src.tensor_bytes(t), "{} is copied", t.name);
            continue;
        }
        assert_eq!(out_info.ty, T::F16, "{}", t.name);
        let (a, b) = (values(&src, &t.name), values(&g, &t.name));
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(quarrel_quant::f32_to_fp16(*x), quarrel_quant::f32_to_fp16(*y), "{}: {x} -> {y}", t.name);
            assert!((x - y).abs() <= x.abs() * (1.0 / 2048.0) + 1e-7, "{}: {x} -> {y}", t.name);
        }
    }

    // Q8_0: every matrix Q8_0 (output too), close to the input
    let g = quantize(&input, &dir.path().join("q8.gguf"), Ftype::Q8_0, QuantizeOptions::default()).unwrap();
    assert_metadata_copied(&src, &g, Ftype::Q8_0);
    for t in src.tensors() {
        assert_eq!(ty(&g, &t.name), if t.dims.len() == 1 { T::F32 } else { T::Q8_0 }, "{}", t.name);
    }
    for name in ["token_embd.weight", "blk.1.ffn_down.weight"] {
        let (a, b) = (values(&src, name), values(&g, name));
        let err: f64 = a.iter().zip(&b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>();
        let norm: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
        assert!(err / norm < 1e-4, "{name}: NMSE {}", err / norm);
    }

    // Q4_K_M on 2 layers of 4 heads / 2 KV heads: use_more_bits picks the last layer's attn_v
    // and ffn_down for Q6_K; the (untied) output is Q6_K, the token embeddings Q4_K
    let g = quantize(&input, &dir.path().join("q4km.gguf"), Ftype::Q4_K_M, QuantizeOptions::default()).unwrap();
    assert_metadata_copied(&src, &g, Ftype::Q4_K_M);
    let want = [
        ("token_embd.weight", T::Q4_K),
        ("output.weight", T::Q6_K),
        ("output_norm.weight", T::F32),
        ("blk.0.attn_norm.weight", T::F32),
        ("blk.0.attn_q.weight", T::Q4_K),
        ("blk.0.attn_v.weight", T::Q4_K),
        ("blk.1.attn_v.weight", T::Q6_K),
        ("blk.0.ffn_down.weight", T::Q4_K),
        ("blk.1.ffn_down.weight", T::Q6_K),
        ("blk.1.ffn_up.weight", T::Q4_K),
    ];
    for (name, t) in want {
        assert_eq!(ty(&g, name), t, "{name}");
    }
    // and the same types as quarrel synth writes for Q4_K_M
    let direct = dir.path().join("direct.gguf");
    quarrel_synth::write_tiny(&direct, Ftype::Q4_K_M, 7).unwrap();
    let direct = Gguf::open(&direct).unwrap();
    for t in direct.tensors() {
        assert_eq!(ty(&g, &t.name), t.ty, "{}", t.name);
    }
    let names_out: Vec<&str> = g.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names_out, names.iter().map(String::as_str).collect::<Vec<_>>(), "input order kept");
}

#[test]
fn requantize_needs_permission_and_same_type_is_copied() {
    let dir = tempfile::tempdir().unwrap();
    let input = tiny_f32(dir.path());
    let q8 = dir.path().join("q8.gguf");
    let q8g = quantize(&input, &q8, Ftype::Q8_0, QuantizeOptions::default()).unwrap();

    let e = fails(&q8, &dir.path().join("q4.gguf"), Ftype::Q4_0, QuantizeOptions::default());
    assert!(matches!(e, QuantizeError::Requantize { from: T::Q8_0, .. }), "{e}");
    assert!(e.to_string().starts_with("requantizing from type q8_0 is disabled"), "{e}");
    assert!(!dir.path().join("q4.gguf").exists() && !dir.path().join("q4.gguf.partial").exists());

    let opts = QuantizeOptions { allow_requantize: true, leave_output_tensor: true, ..Default::default() };
    let g = quantize(&q8, &dir.path().join("q4.gguf"), Ftype::Q4_0, opts).unwrap();
    assert_eq!(ty(&g, "blk.0.attn_q.weight"), T::Q4_0);
    assert_eq!(ty(&g, "output.weight"), T::Q8_0, "--leave-output-tensor");
    assert_eq!(g.tensor("output.weight").unwrap().1, q8g.tensor("output.weight").unwrap().1, "copied as is");

    // a file already of the target type needs no permission: everything is copied
    let g = quantize(&q8, &dir.path().join("q8b.gguf"), Ftype::Q8_0, QuantizeOptions::default()).unwrap();
    for t in q8g.tensors() {
        assert_eq!(g.tensor(&t.name).unwrap().1, q8g.tensor_bytes(t), "{}", t.name);
    }

    // --output-tensor-type, --token-embedding-type
    let opts = QuantizeOptions { output_tensor_type: Some(T::Q8_0), token_embedding_type: Some(T::F16), ..Default::default() };
    let g = quantize(&input, &dir.path().join("ov.gguf"), Ftype::Q4_K_M, opts).unwrap();
    assert_eq!(ty(&g, "output.weight"), T::Q8_0);
    assert_eq!(ty(&g, "token_embd.weight"), T::F16);
    // Q2_K_S needs an importance matrix, as llama-quantize says; a plan alone shows it
    let e = fails(&input, &dir.path().join("q2ks.gguf"), Ftype::Q2_K_S, QuantizeOptions::default());
    assert!(matches!(e, QuantizeError::NeedsImatrix { ty: T::Q2_K, .. }), "{e}");
    let plan = QuantizePlan::unchecked(&Gguf::open(&input).unwrap(), Ftype::Q2_K_S, &QuantizeOptions::default()).unwrap();
    assert!(matches!(plan.refusal(&QuantizeOptions::default()), Some(QuantizeError::NeedsImatrix { .. })));
    let opts = QuantizeOptions { output_tensor_type: Some(T::Q8_K), ..Default::default() };
    let e = fails(&input, &dir.path().join("bad.gguf"), Ftype::Q4_0, opts);
    assert!(matches!(e, QuantizeError::NotAWeightType(T::Q8_K)), "{e}");
}

#[test]
fn same_file_and_bad_input_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let input = tiny_f32(dir.path());
    let e = fails(&input, &input, Ftype::Q8_0, QuantizeOptions::default());
    assert!(matches!(e, QuantizeError::SameFile(_)), "{e}");
    let alias = dir.path().join(".").join("tiny-f32.gguf");
    assert!(matches!(quantize(&input, &alias, Ftype::Q8_0, QuantizeOptions::default()), Err(QuantizeError::SameFile(_))));
    // the input is untouched
    assert!(Gguf::open(&input).is_ok());

    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"GGUF\x03\x00\x00\x00 not really").unwrap();
    let e = fails(&junk, &dir.path().join("o.gguf"), Ftype::Q8_0, QuantizeOptions::default());
    assert!(matches!(e, QuantizeError::Gguf(_)), "{e}");
    let e = fails(&dir.path().join("missing.gguf"), &dir.path().join("o.gguf"), Ftype::Q8_0, QuantizeOptions::default());
    assert!(e.to_string().contains("missing.gguf"), "{e}");
}

#[test]
fn rows_a_block_does_not_divide() {
    // 96-wide rows: the mix's Q4_K falls back to Q5_0; Q4_K asked for by name is an error
    let mut w = quarrel_gguf::GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()));
    w.set("llama.block_count", Value::U32(1));
    let data = vec![0u8; 96 * 4 * 4];
    for name in ["blk.0.attn_q.weight", "output.weight"] {
        w.add_tensor(name, &[96, 4], T::F32).unwrap();
    }
    let g = Gguf::from_bytes(w.to_bytes(&[&data, &data]).unwrap()).unwrap();
    let plan = QuantizePlan::new(&g, Ftype::Q4_K_M, &QuantizeOptions::default()).unwrap();
    assert_eq!((plan.tensors[0].to, plan.tensors[0].fallback_from), (T::Q5_0, Some(T::Q4_K)));
    assert_eq!(plan.tensors[1].to, T::Q8_0, "output rows the default type does not divide: Q8_0");
    assert_eq!(plan.out_bytes, 4 * 3 * 22 + 4 * 3 * 34, "4 rows of 3 blocks each");
    let opts = QuantizeOptions { output_tensor_type: Some(T::Q4_K), ..Default::default() };
    let e = QuantizePlan::new(&g, Ftype::Q4_K_M, &opts).unwrap_err();
    assert!(matches!(e, QuantizeError::RowLength { n: 96, ty: T::Q4_K, .. }), "{e}");
    assert_eq!(e.to_string(), "output.weight: rows of 96 elements cannot be stored as q4_K (blocks of 256)");
}
