//! Pooling of hidden-state rows into one embedding vector (mean in f64, last, CLS), and the
//! row-major output buffer with optional L2 normalization.

use super::types::{Embeddings, Pooling, ServiceError};

/// Pooling accumulator shared by the packed and the chunked embedding paths, so both add
/// rows in the same order and precision (f64 sums).
pub(super) struct PoolAcc {
    sum: Vec<f64>,
    last: Vec<f32>,
    pooling: Pooling,
    n_tokens: usize,
}

impl PoolAcc {
    pub(super) fn new(d: usize) -> PoolAcc {
        PoolAcc { sum: vec![0.0; d], last: vec![], pooling: Pooling::Mean, n_tokens: 1 }
    }

    pub(super) fn add(&mut self, row: &[f32]) {
        if self.sum.len() != row.len() {
            self.sum = vec![0.0; row.len()];
        }
        self.sum.iter_mut().zip(row).for_each(|(a, &b)| *a += b as f64);
        self.last.clear();
        self.last.extend_from_slice(row);
    }

    /// A vector computed from the pooled ones (a classification head's scores).
    pub(super) fn of(v: Vec<f32>) -> PoolAcc {
        PoolAcc { sum: vec![], last: v, pooling: Pooling::Rank, n_tokens: 1 }
    }

    /// The pooled vector's values when pooling takes one row (CLS, last, rank).
    pub(super) fn row(&self) -> &[f32] {
        &self.last
    }

    pub(super) fn with(mut self, pooling: Pooling, n_tokens: usize) -> PoolAcc {
        self.pooling = pooling;
        self.n_tokens = n_tokens.max(1);
        self
    }

    fn dim(&self) -> usize {
        self.last.len()
    }

    /// The pooled vector, appended to `out`.
    fn write(&self, out: &mut Vec<f32>) {
        match self.pooling {
            Pooling::Mean => out.extend(self.sum.iter().map(|&s| (s / self.n_tokens as f64) as f32)),
            Pooling::Cls | Pooling::Last | Pooling::Rank => out.extend_from_slice(&self.last),
        }
    }
}

impl Embeddings {
    /// Append one pooled vector (L2-normalized in f64 when asked); `total` sizes the buffer.
    pub(super) fn push(&mut self, p: PoolAcc, normalize: bool, total: usize) -> Result<(), ServiceError> {
        if self.data.is_empty() {
            self.dim = p.dim();
            self.data.reserve_exact(total * self.dim);
        } else if p.dim() != self.dim {
            return Err(ServiceError::Inference(format!("embedding of {} values after ones of {}", p.dim(), self.dim)));
        }
        let start = self.data.len();
        p.write(&mut self.data);
        if normalize {
            let v = &mut self.data[start..];
            let norm = v.iter().map(|x| (*x as f64) * (*x as f64)).sum::<f64>().sqrt();
            if norm > 0.0 {
                v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
            }
        }
        Ok(())
    }
}
