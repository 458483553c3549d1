//! Sampling on the device against the host reference: `sample_rows` picks the token
//! `quarrel_core::sample_row_ref` picks for the same uniform draw. Needs a CUDA device: ignored
//! unless asked for (scripts/gpu-test.sh).

mod common;
use common::{cuda, rnd};
use quarrel_core::sample::{nucleus, penalized, softmax_seq, top_k_sorted};
use quarrel_core::{sample_row_ref, Backend, SampleRow};

/// Whether the reference's pick for `row` hangs on a comparison within `eps` (top-p's
/// cumulative sum, min-p's threshold, the draw): where CUDA's expf may differ from libm's.
fn near_boundary(logits: &[f32], row: &SampleRow, eps: f32) -> bool {
    if row.temperature <= 0.0 {
        return false;
    }
    let l = penalized(logits, row);
    let mut cand = top_k_sorted(&l, row.top_k);
    let probs = softmax_seq(&cand.iter().map(|c| c.1).collect::<Vec<_>>());
    let mut cum = 0.0f32;
    for &p in &probs {
        cum += p;
        if row.top_p < 1.0 && (cum - row.top_p).abs() < eps {
            return true;
        }
        if row.min_p > 0.0 && (p - row.min_p * probs[0]).abs() < eps {
            return true;
        }
    }
    cand.truncate(nucleus(&probs, row.top_p, row.min_p));
    let probs = softmax_seq(&cand.iter().map(|c| c.1 / row.temperature).collect::<Vec<_>>());
    let mut cum = 0.0f32;
    probs.iter().any(|&p| {
        cum += p;
        (cum - row.r).abs() < eps
    })
}

/// Device sampling picks the reference's token for the same draw on many random rows: several
/// vocabulary sizes, rows with many ties (rounded logits), penalties, greedy rows with penalties,
/// every k up to the bound; a row with top-k 0 sends the call to the host (same picks).
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn sample_rows_match_the_reference() {
    let gpu = cuda();
    let mut s = 0x9e3779b97f4a7c15u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let (mut trials, mut differ, mut ambiguous) = (0, 0, 0);
    for (case, &(dim, n_rows)) in [(1000usize, 1usize), (32000, 3), (49157, 2), (151936, 1), (300, 4)].iter().cycle().take(60).enumerate() {
        let ties = case % 3 == 0;
        let scale = [2.0f32, 6.0, 12.0][case % 3];
        let logits: Vec<f32> =
            rnd(dim * n_rows, 500 + case as u64).iter().map(|v| if ties { (v * 6.0).round() } else { v * scale }).collect();
        let rows: Vec<SampleRow> = (0..n_rows)
            .map(|i| {
                let penalties: Vec<(u32, u32)> = if (case + i) % 2 == 0 {
                    let mut p: Vec<(u32, u32)> =
                        (0..20).map(|_| ((next() * dim as f64 * 1.01) as u32, 1 + (next() * 3.0) as u32)).collect();
                    p.sort_unstable();
                    p.dedup_by_key(|e| e.0);
                    p
                } else {
                    vec![]
                };
                SampleRow {
                    temperature: if (case + i) % 7 == 3 { 0.0 } else { [0.3f32, 0.8, 1.5][(case + i) % 3] },
                    top_k: [1usize, 5, 40, 256, 100][(case + 2 * i) % 5],
                    top_p: [1.0f32, 0.9, 0.5][(case / 2 + i) % 3],
                    min_p: [0.0f32, 0.05][(case / 3 + i) % 2],
                    repeat_penalty: if penalties.is_empty() { 1.0 } else { 1.3 },
                    presence_penalty: if penalties.is_empty() { 0.0 } else { 0.4 },
                    frequency_penalty: if penalties.is_empty() { 0.0 } else { 0.1 },
                    penalties,
                    r: next() as f32,
                }
            })
            .collect();
        let x = gpu.upload(&logits).unwrap();
        let got = gpu.sample_rows(&x, dim, &rows).unwrap();
        for (i, (l, row)) in logits.chunks(dim).zip(&rows).enumerate() {
            let want = sample_row_ref(l, row);
            trials += 1;
            if got[i] != want {
                differ += 1;
                let near = near_boundary(l, row, 1e-5);
                ambiguous += near as usize;
                assert!(near, "case {case} row {i} (dim {dim}, {row:?}): device {} vs reference {want}", got[i]);
            }
        }
    }
    eprintln!("sample_rows: {trials} rows, {differ} picks differ (all within 1e-5 of a boundary: {ambiguous})");
    assert!(differ * 50 <= trials, "{differ} of {trials} picks differ");
    // top-k 0 (all tokens) runs on the host: same picks
    let l = rnd(5000, 3);
    let row = SampleRow {
        temperature: 0.9,
        top_k: 0,
        top_p: 0.95,
        min_p: 0.0,
        repeat_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        penalties: vec![],
        r: 0.37,
    };
    let x = gpu.upload(&l).unwrap();
    assert_eq!(gpu.sample_rows(&x, 5000, std::slice::from_ref(&row)).unwrap(), vec![sample_row_ref(&l, &row)]);
    // a shape mismatch is an error
    assert!(gpu.sample_rows(&x, 4999, std::slice::from_ref(&row)).is_err());
}
