//! Sampling on the device (`Backend::sample_rows`, kernels/sample.cu): one block per logits row
//! runs the row's chain (penalties, top-k <= `SAMPLE_MAX_K`, top-p, min-p, temperature, the
//! host's uniform draw) and only the token ids come back. Rows the kernel does not take (top-k
//! 0 or above `SAMPLE_MAX_K` with a temperature) make the whole call download the logits and
//! run the reference (`quarrel_core::sample_row_ref`) on the host.
//!
//! ```text
//!  logits (rows, dim) ──sample_rows──► ids (rows) ──download──► host
//!  params (10 words / row) + penalty pairs ──upload (stream-ordered)──┘
//! ```

use crate::error::CudaError;
use crate::fusion::Device;
use crate::runtime::Arg;
use quarrel_core::SampleRow;

/// Words per row of the parameter array (kernels/sample.cu SAMPLE_PARAMS).
const PARAMS: usize = 10;

/// The parameter words of `rows` and their penalty pairs (never empty: one dummy pair).
pub(crate) fn pack(rows: &[SampleRow]) -> (Vec<u32>, Vec<u32>) {
    let mut prm = Vec::with_capacity(PARAMS * rows.len());
    let mut pens = vec![];
    for r in rows {
        let first = (pens.len() / 2) as u32;
        for &(t, n) in &r.penalties {
            pens.extend([t, n]);
        }
        prm.extend([
            r.temperature.to_bits(),
            r.top_k as u32,
            r.top_p.to_bits(),
            r.min_p.to_bits(),
            r.repeat_penalty.to_bits(),
            r.presence_penalty.to_bits(),
            r.frequency_penalty.to_bits(),
            r.r.to_bits(),
            first,
            r.penalties.len() as u32,
        ]);
    }
    if pens.is_empty() {
        pens.extend([0, 0]);
    }
    (prm, pens)
}

/// Launch `sample_rows` over `rows.len()` rows of `dim` logits at `x` and download the ids.
pub(crate) fn sample(dev: &Device, x: u64, dim: usize, rows: &[SampleRow]) -> Result<Vec<u32>, CudaError> {
    if dim > i32::MAX as usize || rows.len() > u32::MAX as usize {
        return Err(CudaError::Shape(format!("sample_rows: {} rows of {dim}", rows.len())));
    }
    let (prm, pens) = pack(rows);
    let prm = dev.upload_async(&prm)?;
    let pens = dev.upload_async(&pens)?;
    let work = dev.scratch(4 * dim * rows.len())?;
    let ids = dev.scratch(4 * rows.len())?;
    dev.launch(
        "sample_rows",
        (rows.len() as u32, 1, 1),
        1024,
        0,
        &[Arg::P(x), Arg::P(work.ptr()), Arg::P(prm.ptr()), Arg::P(pens.ptr()), Arg::P(ids.ptr()), Arg::I(dim as i32)],
    )?;
    dev.download::<u32>(ids.ptr(), rows.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_lays_out_rows_and_penalty_ranges() {
        let row = |pen: Vec<(u32, u32)>| SampleRow {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.9,
            min_p: 0.05,
            repeat_penalty: 1.1,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            penalties: pen,
            r: 0.3,
        };
        let (prm, pens) = pack(&[row(vec![(5, 2), (9, 1)]), row(vec![]), row(vec![(3, 4)])]);
        assert_eq!(prm.len(), 3 * PARAMS);
        assert_eq!(pens, vec![5, 2, 9, 1, 3, 4]);
        assert_eq!((prm[8], prm[9]), (0, 2));
        assert_eq!((prm[PARAMS + 8], prm[PARAMS + 9]), (2, 0));
        assert_eq!((prm[2 * PARAMS + 8], prm[2 * PARAMS + 9]), (2, 1));
        assert_eq!(f32::from_bits(prm[7]), 0.3);
        assert_eq!(prm[1], 40);
        let (_, pens) = pack(&[row(vec![])]);
        assert_eq!(pens, vec![0, 0]);
    }
}
