//! LayerNorm (ggml's `norm` + `mul` + `add`) against a plain f64 reference twin, on widths
//! with and without a tail past the 16-value blocks, rows with a large common offset, any
//! thread count giving the same bits, and bad shapes as errors.

mod common;
use quarrel_core::{Backend, QuantType, WeightSource};
use quarrel_cpu::CpuBackend;
use quarrel_gguf::{Gguf, GgufWriter};
use std::sync::Arc;

fn vectors(d: usize, w: &[f32], b: &[f32]) -> Arc<Gguf> {
    let mut g = GgufWriter::new();
    g.add_tensor("w", &[d as u64], QuantType::F32).unwrap();
    g.add_tensor("b", &[d as u64], QuantType::F32).unwrap();
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (wb, bb) = (bytes(w), bytes(b));
    Arc::new(Gguf::from_bytes(g.to_bytes(&[&wb, &bb]).unwrap()).unwrap())
}

fn reference(x: &[f32], w: &[f32], b: &[f32], eps: f32) -> Vec<f32> {
    let d = w.len();
    x.chunks(d)
        .flat_map(|r| {
            let mean = r.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
            let var = r.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
            let s = 1.0 / (var + eps as f64).sqrt();
            r.iter()
                .zip(w.iter().zip(b))
                .map(move |(&v, (&g, &c))| ((v as f64 - mean) * s * g as f64 + c as f64) as f32)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn layer_norm_matches_reference_on_any_thread_count() {
    let backends: Vec<CpuBackend> = [1, 3].iter().map(|&t| CpuBackend::new(t).unwrap()).collect();
    for (seed, d) in [16usize, 48, 100, 576, 3072].into_iter().enumerate() {
        let seed = seed as u64;
        let (w, b) = (common::rnd_from_state(seed + 1, d, 1.0), common::rnd_from_state(seed + 2, d, 0.5));
        let g = vectors(d, &w, &b);
        for rows in [1usize, 7, 33] {
            // a common offset of 40 on every row: the centered sum keeps its precision
            let x: Vec<f32> = common::rnd_from_state(seed + 3, rows * d, 3.0).iter().map(|v| v + 40.0).collect();
            let want = reference(&x, &w, &b, 1e-5);
            let mut outs = vec![];
            for be in &backends {
                let wt = be.load_weight(WeightSource { gguf: &g, name: "w" }).unwrap();
                let bt = be.load_weight(WeightSource { gguf: &g, name: "b" }).unwrap();
                let mut out = vec![0f32; x.len()];
                be.layer_norm(&x, &wt, &bt, 1e-5, &mut out).unwrap();
                let e = common::nmse(&want, &out);
                // f32 centering of values near 40 keeps ~1e-6 relative error: NMSE ~1e-12
                assert!(e < 1e-10, "d {d}, {rows} rows: nmse {e:.3e} vs the f64 reference");
                outs.push(out.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
            }
            assert_eq!(outs[0], outs[1], "d {d}, {rows} rows: 1 and 3 threads differ");
        }
    }
}

#[test]
fn layer_norm_shape_errors() {
    let be = CpuBackend::new(1).unwrap();
    let g = vectors(16, &[1.0; 16], &[0.0; 16]);
    let g2 = vectors(8, &[1.0; 8], &[0.0; 8]);
    let w = be.load_weight(WeightSource { gguf: &g, name: "w" }).unwrap();
    let b8 = be.load_weight(WeightSource { gguf: &g2, name: "b" }).unwrap();
    let mut out = vec![0f32; 20];
    assert!(be.layer_norm(&vec![0.0; 20], &w, &w, 1e-5, &mut out).is_err(), "20 values are not rows of 16");
    let mut out = vec![0f32; 16];
    assert!(be.layer_norm(&vec![0.0; 16], &w, &b8, 1e-5, &mut out).is_err(), "a bias of 8 for rows of 16");
}
