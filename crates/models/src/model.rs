//! The `Model` trait.

use quarrel_core::{Backend, ForwardBatch, Result};

/// What the engine needs to know to allocate caches and drive a model.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub arch: String,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    /// Training context length (`{arch}.context_length`).
    pub n_ctx_train: usize,
    /// Attention layers' KV shape (all attention layers share it).
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Parameters (elements of all tensors), for display.
    pub n_params: u64,
    /// Per layer: the Mamba2 shape of a recurrent layer, None otherwise (empty when the
    /// model has no recurrent layers). The engine allocates one state slot per sequence.
    pub recurrent: Vec<Option<quarrel_core::SsmParams>>,
    /// Whether a token attends only to the tokens before it (decoders); false for encoders,
    /// whose texts must each be run in one forward.
    pub causal: bool,
}

impl ModelInfo {
    /// Whether any layer carries recurrent state.
    pub fn is_recurrent(&self) -> bool {
        self.recurrent.iter().any(Option::is_some)
    }
}

/// One architecture, loaded on one backend. The architecture files implement it through
/// `arch::common::LayerStack` (their layers and head; the outputs below are computed there
/// once for all of them).
pub trait Model<B: Backend>: Send + Sync {
    fn info(&self) -> &ModelInfo;
    /// The context length the engine runs the model with, told once before the first
    /// forward: a model whose rotation depends on it (LongRoPE's short and long frequency
    /// factors, chosen by whether it exceeds the original training context) sets up here.
    fn set_context_len(&mut self, _n_ctx: usize) {}
    /// Run a flat batch; returns logits `(batch.logits_rows.len(), n_vocab)` row-major.
    fn forward(&self, be: &B, batch: &ForwardBatch, kv: &mut B::Kv) -> Result<Vec<f32>>;
    /// The logits of the `logits_rows` left on the backend, `(rows, n_vocab)`: where the
    /// picks run (`Backend::argmax_rows` / `Backend::sample_rows`: a device backend sends back
    /// only the ids; its launches may still be running when this returns).
    fn logits(&self, be: &B, batch: &ForwardBatch, kv: &mut B::Kv) -> Result<B::Buf>;
    /// Like `forward`, but returns the final normalized hidden states `(rows, n_embd)` of the
    /// `logits_rows` instead of logits (what embeddings are pooled from).
    fn hidden(&self, _be: &B, _batch: &ForwardBatch, _kv: &mut B::Kv) -> Result<Vec<f32>> {
        Err(quarrel_core::CoreError::Unsupported(format!("{}: hidden-state output", self.info().arch)))
    }
    /// MoE routing and Mamba2 conv / scan time since load (zero for models without them).
    fn op_times(&self) -> crate::layers::timing::OpTimes {
        Default::default()
    }
    /// Classes a cross-encoder scores (0: the model has no classification head).
    fn n_classes(&self) -> usize {
        0
    }
    /// A cross-encoder's classification head on `rows` pooled hidden states
    /// `(rows, n_embd)`: scores `(rows, n_classes)` (llama.cpp's rank pooling).
    fn classify(&self, _be: &B, _pooled: &[f32], _rows: usize) -> Result<Vec<f32>> {
        Err(quarrel_core::CoreError::Unsupported(format!("{}: no classification head (not a reranking model)", self.info().arch)))
    }
}
