//! Q4_0 and Q4_K weights on x86 with AVX-512 VNNI run through the repacked kernels
//! (`quarrel_cpu::simd::repack`), whose float order is that of llama.cpp's own repacked
//! x86 kernels (`ggml_gemm_q4_0_8x8_q8_0`, `ggml_gemm_q4_K_8x8_q8_K`): the logits of the
//! `tiny` synthetic model (`quarrel synth -p tiny -q q4_0|q4_k_m --seed 7`) then equal
//! llama.cpp's to the fixtures' printed precision (NMSE <= 1e-9; the fixtures come from
//! scripts/moe_fixtures.c against llama.cpp 0.3.36's libllama, CPU, AVX-512 VNNI, one
//! 16-token llama_decode). Q4_K_M's Q6_K tensors take the vec_dot kernels, which match
//! llama.cpp's too. Elsewhere (with repacking off, `tuning::set_repack(false)`: the vec_dot-order kernels; a level below
//! AVX-512 VNNI: other Q6_K / attention kernels) the bound is NMSE <= 1e-3.

mod common;
use common::*;
use quarrel_core::QuantType;
use quarrel_engine::EngineOptions;
use quarrel_synth::{write_synth, Ftype, Preset, SynthSpec};

#[derive(serde::Deserialize)]
struct Fixture {
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

#[test]
fn q4_0_and_q4_k_logits_match_llama_cpp_repacked_kernels() {
    let dir = tempfile::tempdir().unwrap();
    let repacked =
        quarrel_cpu::simd::repack::enabled(QuantType::Q4_0).is_some() && quarrel_cpu::simd::repack::enabled(QuantType::Q4_K).is_some();
    // the other kernels (Q6_K, attention) match llama.cpp's AVX-512 build at that level only
    let full = repacked && quarrel_cpu::simd::detected_level() == quarrel_cpu::simd::Level::Avx512Vnni;
    let bound = if full { 1e-9 } else { 1e-3 };
    for ftype in ["q4_0", "q4_k_m"] {
        let path = dir.path().join(format!("tiny-{ftype}.gguf"));
        let spec = SynthSpec::new(*Preset::by_name("tiny").unwrap(), Ftype::from_name(ftype).unwrap()).seed(7);
        write_synth(&spec, &path, &mut |_, _| {}).unwrap();
        let text = std::fs::read_to_string(fixture(&format!("repack/tiny-{ftype}.json"))).unwrap();
        let f: Fixture = serde_json::from_str(&text).unwrap();
        let mut e = engine(&path, EngineOptions { n_ctx: 64, ..Default::default() });
        let ours = e.eval_all(&f.tokens).unwrap();
        assert_eq!(ours.len(), f.logits.len());
        let errs: Vec<f64> = f.logits.iter().zip(&ours).map(|(a, b)| nmse(a, b)).collect();
        let worst = errs.iter().copied().fold(0f64, f64::max);
        eprintln!("{ftype}: worst nmse {worst:.2e} over {} positions (repacked kernels: {repacked})", errs.len());
        assert!(worst <= bound, "{ftype}: logits vs llama.cpp nmse {worst:.2e} > {bound:e}: {errs:?}");
    }
}
