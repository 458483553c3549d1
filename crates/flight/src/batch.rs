//! Embedding rows <-> Arrow RecordBatches in Longbow's schema:
//! `id` utf8, `vector` fixed_size_list<float32>[dim], optional `metadata` (JSON utf8) and `text`.
//!
//! The vectors arrive as one row-major `Vec<f32>` (the engine's `Embeddings` buffer); it is
//! moved into the Arrow buffer of the list's child array, so building a batch copies no
//! vector element. Slicing a batch for transport (`RecordBatch::slice`) copies nothing either.

use crate::error::{FlightClientError, Result};
use arrow_array::{Array, ArrayRef, FixedSizeListArray, Float32Array, RecordBatch, StringArray};
use arrow_buffer::ScalarBuffer;
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use std::sync::Arc;

/// Field of the `vector` list's values (pyarrow's default name and nullability).
fn item_field() -> Arc<Field> {
    Arc::new(Field::new("item", DataType::Float32, true))
}

/// Longbow's schema for vectors of `dim` values.
pub fn embedding_schema(dim: usize, with_metadata: bool, with_text: bool) -> Result<SchemaRef> {
    let d = i32::try_from(dim).ok().filter(|&d| d > 0).ok_or_else(|| FlightClientError::InvalidRows(format!("dimension {dim}")))?;
    let mut fields = vec![Field::new("id", DataType::Utf8, false), Field::new("vector", DataType::FixedSizeList(item_field(), d), false)];
    if with_metadata {
        fields.push(Field::new("metadata", DataType::Utf8, true));
    }
    if with_text {
        fields.push(Field::new("text", DataType::Utf8, true));
    }
    Ok(Arc::new(Schema::new(fields)))
}

/// Rows to store: ids, a row-major `(rows, dim)` vector buffer and optional columns.
#[derive(Clone, Debug, Default)]
pub struct EmbeddingRows {
    pub ids: Vec<String>,
    pub dim: usize,
    pub vectors: Vec<f32>,
    /// A JSON document per row (`None`: null).
    pub metadata: Option<Vec<Option<String>>>,
    pub text: Option<Vec<String>>,
}

impl EmbeddingRows {
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Move the rows into a RecordBatch (the vector buffer becomes the Arrow buffer).
    pub fn into_record_batch(self) -> Result<RecordBatch> {
        let n = self.ids.len();
        if self.dim == 0 || self.vectors.len() != n * self.dim {
            return Err(FlightClientError::InvalidRows(format!(
                "{} ids and {} vector values do not make rows of dimension {}",
                n,
                self.vectors.len(),
                self.dim
            )));
        }
        if let Some(m) = &self.metadata {
            if m.len() != n {
                return Err(FlightClientError::InvalidRows(format!("{} metadata values for {n} rows", m.len())));
            }
            if let Some((i, e)) = m
                .iter()
                .enumerate()
                .find_map(|(i, s)| s.as_deref().and_then(|s| serde_json::from_str::<serde_json::Value>(s).err()).map(|e| (i, e)))
            {
                return Err(FlightClientError::InvalidRows(format!("metadata of row {i} ({}) is not JSON: {e}", self.ids[i])));
            }
        }
        if let Some(t) = &self.text {
            if t.len() != n {
                return Err(FlightClientError::InvalidRows(format!("{} texts for {n} rows", t.len())));
            }
        }
        let schema = embedding_schema(self.dim, self.metadata.is_some(), self.text.is_some())?;
        let values = Float32Array::new(ScalarBuffer::from(self.vectors), None);
        let vector = FixedSizeListArray::try_new(item_field(), self.dim as i32, Arc::new(values), None)?;
        let mut cols: Vec<ArrayRef> = vec![Arc::new(StringArray::from(self.ids)), Arc::new(vector)];
        if let Some(m) = self.metadata {
            cols.push(Arc::new(StringArray::from(m)));
        }
        if let Some(t) = self.text {
            cols.push(Arc::new(StringArray::from(t)));
        }
        Ok(RecordBatch::try_new(schema, cols)?)
    }
}

/// Zero-copy views of `batch_rows`-row pieces of `batch`.
pub fn split(batch: &RecordBatch, batch_rows: usize) -> Vec<RecordBatch> {
    let step = batch_rows.max(1);
    (0..batch.num_rows()).step_by(step).map(|o| batch.slice(o, step.min(batch.num_rows() - o))).collect()
}

/// Ids and vectors read back from a batch in Longbow's schema.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Vectors {
    pub ids: Vec<String>,
    pub dim: usize,
    pub data: Vec<f32>,
}

impl Vectors {
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }

    /// Append the rows of `batch` (columns `id` and `vector`).
    pub fn extend_from(&mut self, batch: &RecordBatch) -> Result<()> {
        let bad = |m: String| FlightClientError::Protocol { op: "decode", reason: m };
        let ids = batch
            .column_by_name("id")
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .ok_or_else(|| bad("no utf8 `id` column".into()))?;
        let list = batch
            .column_by_name("vector")
            .and_then(|c| c.as_any().downcast_ref::<FixedSizeListArray>())
            .ok_or_else(|| bad("no fixed-size-list `vector` column".into()))?;
        let dim = list.value_length() as usize;
        if self.dim != 0 && self.dim != dim {
            return Err(bad(format!("vectors of dimension {dim} after ones of {}", self.dim)));
        }
        self.dim = dim;
        let vals = list.values().as_any().downcast_ref::<Float32Array>().ok_or_else(|| bad("`vector` values are not float32".into()))?;
        let off = list.offset() * dim;
        self.data.extend_from_slice(&vals.values()[off..off + list.len() * dim]);
        self.ids.extend(ids.iter().map(|s| s.unwrap_or_default().to_string()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn vectors_move_into_the_arrow_buffer() {
        let v: Vec<f32> = (0..12).map(|x| x as f32).collect();
        let ptr = v.as_ptr();
        let rows = EmbeddingRows { ids: vec!["a".into(), "b".into(), "c".into()], dim: 4, vectors: v, metadata: None, text: None };
        let b = rows.into_record_batch().unwrap();
        let list = b.column(1).as_any().downcast_ref::<FixedSizeListArray>().unwrap();
        let vals = list.values().as_any().downcast_ref::<Float32Array>().unwrap();
        assert_eq!(vals.values().as_ptr(), ptr, "the embedding buffer was copied");
        // pieces are views into the same buffer
        let parts = split(&b, 2);
        assert_eq!(parts.iter().map(|p| p.num_rows()).collect::<Vec<_>>(), vec![2, 1]);
        let l1 = parts[1].column(1).as_any().downcast_ref::<FixedSizeListArray>().unwrap();
        let v1 = l1.values().as_any().downcast_ref::<Float32Array>().unwrap();
        assert_eq!(v1.values().as_ptr(), ptr.wrapping_add(2 * 4));
    }

    #[test]
    fn bad_rows_are_errors() {
        let r = |n_vals: usize, dim: usize| EmbeddingRows { ids: vec!["a".into()], dim, vectors: vec![0.0; n_vals], ..Default::default() };
        assert!(r(3, 4).into_record_batch().is_err());
        assert!(r(0, 0).into_record_batch().is_err());
        let mut m = r(4, 4);
        m.metadata = Some(vec![Some("{not json".into())]);
        assert!(m.into_record_batch().unwrap_err().to_string().contains("not JSON"));
        let mut t = r(4, 4);
        t.text = Some(vec![]);
        assert!(t.into_record_batch().is_err());
    }

    proptest! {
        /// Build, split at any size, read back: the same ids and bit-identical vectors.
        #[test]
        fn split_and_read_back_round_trips(n in 1usize..40, dim in 1usize..20, rows in 1usize..50, seed in any::<u32>()) {
            let data: Vec<f32> = (0..n * dim).map(|i| ((i as u32).wrapping_mul(2654435761) ^ seed) as f32 / 1e6).collect();
            let ids: Vec<String> = (0..n).map(|i| format!("doc-{i}")).collect();
            let text = Some(ids.iter().map(|i| format!("text of {i}")).collect());
            let metadata = Some((0..n).map(|i| (i % 3 != 0).then(|| format!("{{\"i\":{i}}}"))).collect());
            let b = EmbeddingRows { ids: ids.clone(), dim, vectors: data.clone(), metadata, text }.into_record_batch().unwrap();
            prop_assert_eq!(b.schema().fields().len(), 4);
            let mut back = Vectors::default();
            for p in split(&b, rows) {
                prop_assert!(p.num_rows() <= rows);
                back.extend_from(&p).unwrap();
            }
            prop_assert_eq!(back.ids, ids);
            prop_assert_eq!(back.dim, dim);
            prop_assert_eq!(back.data.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), data.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        }
    }
}
