//! Sampling on the device (`Backend::sample_rows`, kernels/sample.cu): one block per logits row
//! runs the row's chain (biases, the allowed-token mask, penalties, top-k <= `SAMPLE_MAX_K`,
//! top-p, min-p, temperature, the host's uniform draw) and only the token ids come back. Rows
//! the kernel does not take (top-k 0 or above `SAMPLE_MAX_K` with a temperature) make the whole
//! call download the logits and run the reference (`quarrel_core::sample_masked_ref`) on the
//! host.
//!
//! ```text
//!  forward (queued) ──flush──► GPU          host threads: masks ─┐
//!  logits (rows, dim) ──sample_rows──► ids (rows) ──download──►  │  host
//!  params (14 words / row) + penalty / bias pairs + mask words ◄─┘ (one upload, stream-ordered)
//! ```

use crate::error::CudaError;
use crate::fusion::Device;
use crate::runtime::Arg;
use crate::{CudaBackend, CudaBuf};
use quarrel_core::{sample_masked_ref, Backend, CoreError, Result, RowMasks, SampleRow, TokenMask};

/// Words per row of the parameter array (kernels/sample.cu SAMPLE_PARAMS).
const PARAMS: usize = 14;
/// The mask offset of an unmasked row (kernels/sample.cu NO_MASK).
const NO_MASK: u32 = u32::MAX;

/// The parameter words of `rows` and the data they point into (never empty): per row the
/// penalty pairs (token, count), the bias pairs (token, f32 bits) and the mask words.
pub(crate) fn pack(rows: &[SampleRow], masks: &[Option<TokenMask>]) -> (Vec<u32>, Vec<u32>) {
    let mut prm = Vec::with_capacity(PARAMS * rows.len());
    let mut data = vec![];
    for (i, r) in rows.iter().enumerate() {
        let pens = data.len() as u32;
        data.extend(r.penalties.iter().flat_map(|&(t, n)| [t, n]));
        let bias = data.len() as u32;
        data.extend(r.bias.iter().flat_map(|&(t, b)| [t, b.to_bits()]));
        let (mask, mask_words) = match masks.get(i).and_then(Option::as_ref) {
            Some(m) => {
                let at = data.len() as u32;
                data.extend_from_slice(m.words());
                (at, m.words().len() as u32)
            }
            None => (NO_MASK, 0),
        };
        prm.extend([
            r.temperature.to_bits(),
            r.top_k as u32,
            r.top_p.to_bits(),
            r.min_p.to_bits(),
            r.repeat_penalty.to_bits(),
            r.presence_penalty.to_bits(),
            r.frequency_penalty.to_bits(),
            r.r.to_bits(),
            pens,
            r.penalties.len() as u32,
            bias,
            r.bias.len() as u32,
            mask,
            mask_words,
        ]);
    }
    if data.is_empty() {
        data.push(0);
    }
    (prm, data)
}

/// `Backend::sample_rows` on the device. Masks still being computed are waited for after the
/// queued forward has gone to the GPU, so that the two overlap.
pub(crate) fn sample_rows(be: &CudaBackend, x: &CudaBuf, dim: usize, rows: &[SampleRow], masks: RowMasks) -> Result<Vec<u32>> {
    be.dev.bind()?;
    if dim == 0 || x.len != dim * rows.len() || masks.len() != rows.len() {
        return Err(CoreError::Shape(format!(
            "sample_rows: {} values are not {} rows of {dim} ({} masks)",
            x.len,
            rows.len(),
            masks.len()
        )));
    }
    if rows.is_empty() {
        return Ok(vec![]);
    }
    if !masks.any() && rows.iter().all(SampleRow::is_plain_argmax) {
        return be.argmax_rows(x, dim);
    }
    if !rows.iter().all(SampleRow::device_ok) {
        // top-k unbounded: the chain on the host
        let v = be.download(x)?;
        let masks = masks.wait()?;
        return Ok(v.chunks(dim).zip(rows).zip(&masks).map(|((l, r), m)| sample_masked_ref(l, r, m.as_ref())).collect());
    }
    let xp = be.rd(x)?;
    if masks.any() {
        be.dev.flush()?;
    }
    let masks = masks.wait()?;
    let v = sample(&be.dev, xp, dim, rows, &masks)?;
    be.step_end()?;
    Ok(v)
}

/// Launch `sample_rows` over `rows.len()` rows of `dim` logits at `x` and download the ids.
fn sample(dev: &Device, x: u64, dim: usize, rows: &[SampleRow], masks: &[Option<TokenMask>]) -> std::result::Result<Vec<u32>, CudaError> {
    if dim > i32::MAX as usize || rows.len() > u32::MAX as usize {
        return Err(CudaError::Shape(format!("sample_rows: {} rows of {dim}", rows.len())));
    }
    let (prm, data) = pack(rows, masks);
    if data.len() > NO_MASK as usize {
        return Err(CudaError::Shape(format!("sample_rows: {} words of penalties, biases and masks", data.len())));
    }
    let prm = dev.upload_async(&prm)?;
    let data = dev.upload_async(&data)?;
    let work = dev.scratch(4 * dim * rows.len())?;
    let ids = dev.scratch(4 * rows.len())?;
    dev.launch(
        "sample_rows",
        (rows.len() as u32, 1, 1),
        1024,
        0,
        &[Arg::P(x), Arg::P(work.ptr()), Arg::P(prm.ptr()), Arg::P(data.ptr()), Arg::P(ids.ptr()), Arg::I(dim as i32)],
    )?;
    dev.download::<u32>(ids.ptr(), rows.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_lays_out_rows_penalties_biases_and_masks() {
        let row = |pen: Vec<(u32, u32)>, bias: Vec<(u32, f32)>| SampleRow {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.9,
            min_p: 0.05,
            repeat_penalty: 1.1,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            penalties: pen,
            bias,
            r: 0.3,
        };
        let rows = [row(vec![(5, 2), (9, 1)], vec![(7, -1.5)]), row(vec![], vec![]), row(vec![(3, 4)], vec![])];
        let masks = [None, Some(TokenMask::from_words(vec![0xf0, 1])), Some(TokenMask::from_words(vec![2]))];
        let (prm, data) = pack(&rows, &masks);
        assert_eq!(prm.len(), 3 * PARAMS);
        assert_eq!(data, vec![5, 2, 9, 1, 7, (-1.5f32).to_bits(), 0xf0, 1, 3, 4, 2]);
        // row 0: penalties at 0 (2 pairs), biases at 4 (1 pair), no mask
        assert_eq!(&prm[8..14], &[0, 2, 4, 1, NO_MASK, 0]);
        // row 1: no penalties or biases, mask words at 6 (2 words)
        assert_eq!(&prm[PARAMS + 8..PARAMS + 14], &[6, 0, 6, 0, 6, 2]);
        // row 2: one penalty pair at 8, its mask at 10
        assert_eq!(&prm[2 * PARAMS + 8..2 * PARAMS + 14], &[8, 1, 10, 0, 10, 1]);
        assert_eq!(f32::from_bits(prm[7]), 0.3);
        assert_eq!(prm[1], 40);
        let (_, data) = pack(&[row(vec![], vec![])], &[None]);
        assert_eq!(data, vec![0]);
    }
}
