//! Sampling on the device against the host reference: `sample_rows` picks the token
//! `quarrel_core::sample_masked_ref` picks for the same uniform draw, biases and allowed-token
//! mask. Needs a CUDA device: ignored unless asked for (scripts/gpu-test.sh).

mod common;
use common::{cuda, rnd};
use quarrel_core::sample::{adjusted, nucleus, softmax_seq, top_k_sorted};
use quarrel_core::{sample_masked_ref, sample_row_ref, Backend, RowMasks, SampleRow, TokenMask};

/// Whether the reference's pick for `row` hangs on a comparison within `eps` (top-p's
/// cumulative sum, min-p's threshold, the draw): where CUDA's expf may differ from libm's.
fn near_boundary(logits: &[f32], row: &SampleRow, mask: Option<&TokenMask>, eps: f32) -> bool {
    if row.temperature <= 0.0 {
        return false;
    }
    let l = adjusted(logits, row, mask);
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

/// A mask of `dim` tokens (words for `dim - short` of them: the tail is disallowed) allowing
/// each with probability `p`, and always token `always` (a constraint never allows nothing).
fn random_mask(next: &mut impl FnMut() -> f64, dim: usize, short: usize, p: f64, always: usize) -> TokenMask {
    let n = dim - short;
    let mut words = vec![0u32; n.div_ceil(32)];
    for t in 0..n {
        if next() < p || t == always {
            words[t / 32] |= 1 << (t % 32);
        }
    }
    TokenMask::from_words(words)
}

/// Device sampling picks the reference's token for the same draw on many random rows: several
/// vocabulary sizes, rows with many ties (rounded logits), penalties, logit biases, allowed-token
/// masks (dense, sparse as a grammar's, shorter than the row), greedy rows with penalties,
/// every k up to the bound; masks given at once or arriving from another thread after the
/// call began; a row with top-k 0 sends the call to the host (same picks).
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
    let (mut trials, mut differ, mut ambiguous, mut masked) = (0, 0, 0, 0);
    for (case, &(dim, n_rows)) in [(1000usize, 1usize), (32000, 3), (49157, 2), (151936, 1), (300, 4)].iter().cycle().take(90).enumerate() {
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
                // biases: a token may repeat, some lie past the row
                let bias: Vec<(u32, f32)> = if (case + i) % 4 == 1 {
                    (0..12)
                        .map(|_| ((next() * dim as f64 * 1.05) as u32, (next() as f32 - 0.5) * 40.0))
                        .chain([(3, 1.5), (3, 2.5)])
                        .collect()
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
                    bias,
                    r: next() as f32,
                }
            })
            .collect();
        // cases 30..: masks on some rows (dense, a grammar's few tokens, short of the row)
        let masks: Vec<Option<TokenMask>> = (0..n_rows)
            .map(|i| {
                let always = (next() * dim as f64) as usize % (dim - 7);
                match (case >= 30, (case + i) % 3) {
                    (false, _) => None,
                    (true, 0) => Some(random_mask(&mut next, dim, 0, 0.5, always)),
                    (true, 1) => Some(random_mask(&mut next, dim, 7, 0.002, always)),
                    _ => None,
                }
            })
            .collect();
        masked += masks.iter().flatten().count();
        let x = gpu.upload(&logits).unwrap();
        let got = if case % 2 == 0 {
            gpu.sample_rows(&x, dim, &rows, RowMasks::ready(masks.clone())).unwrap()
        } else {
            // the masks arrive while the call waits
            let (tx, pending) = RowMasks::pending(n_rows, masks.iter().flatten().count());
            std::thread::scope(|sc| {
                let m = &masks;
                sc.spawn(move || {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    for (i, m) in m.iter().enumerate() {
                        if let Some(m) = m {
                            tx.send(i, m.clone());
                        }
                    }
                });
                gpu.sample_rows(&x, dim, &rows, pending).unwrap()
            })
        };
        for (i, ((l, row), mask)) in logits.chunks(dim).zip(&rows).zip(&masks).enumerate() {
            let want = sample_masked_ref(l, row, mask.as_ref());
            assert!(mask.as_ref().is_none_or(|m| m.allows(got[i])), "case {case} row {i}: device picked {} outside the mask", got[i]);
            trials += 1;
            if got[i] != want {
                differ += 1;
                let near = near_boundary(l, row, mask.as_ref(), 1e-5);
                ambiguous += near as usize;
                assert!(near, "case {case} row {i} (dim {dim}, {row:?}, {mask:?}): device {} vs reference {want}", got[i]);
            }
        }
    }
    eprintln!("sample_rows: {trials} rows ({masked} masked), {differ} picks differ (all within 1e-5 of a boundary: {ambiguous})");
    assert!(differ * 50 <= trials, "{differ} of {trials} picks differ");
    assert!(masked >= 20, "only {masked} masked rows");
    // top-k 0 (all tokens) runs on the host: same picks, masked too
    let l = rnd(5000, 3);
    let row = SampleRow { temperature: 0.9, top_k: 0, top_p: 0.95, r: 0.37, ..SampleRow::greedy() };
    let x = gpu.upload(&l).unwrap();
    assert_eq!(gpu.sample_rows(&x, 5000, std::slice::from_ref(&row), RowMasks::none(1)).unwrap(), vec![sample_row_ref(&l, &row)]);
    let m = random_mask(&mut next, 5000, 0, 0.01, 17);
    let got = gpu.sample_rows(&x, 5000, std::slice::from_ref(&row), RowMasks::ready(vec![Some(m.clone())])).unwrap();
    assert_eq!(got, vec![sample_masked_ref(&l, &row, Some(&m))]);
    // greedy with a mask: the largest allowed logit
    let g = SampleRow::greedy();
    let got = gpu.sample_rows(&x, 5000, std::slice::from_ref(&g), RowMasks::ready(vec![Some(m.clone())])).unwrap();
    assert_eq!(got, vec![sample_masked_ref(&l, &g, Some(&m))]);
    assert!(m.allows(got[0]));
    // a shape mismatch is an error; so is a mask that never comes
    assert!(gpu.sample_rows(&x, 4999, std::slice::from_ref(&row), RowMasks::none(1)).is_err());
    let (tx, pending) = RowMasks::pending(1, 1);
    drop(tx);
    assert!(gpu.sample_rows(&x, 5000, std::slice::from_ref(&row), pending).is_err());
}
