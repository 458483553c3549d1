//! What the scheduler needs from a model: a batched forward over the paged cache that picks
//! tokens, hidden states for embeddings, and the recurrent-state slots.

use crate::decode::{masks_now, pick_on_host, MaskJob, Picked, RowPick};
use crate::speculative::{DraftRequest, SpecOptions};
use quarrel_core::ForwardBatch;

/// What the scheduler needs from a model: a batched forward over the paged cache.
pub trait StepModel {
    fn n_vocab(&self) -> usize;
    /// Logits `(batch.logits_rows.len(), n_vocab)`.
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<f32>, String>;
    /// Run `batch` and pick one token per logits row (`rows` in `logits_rows` order) among
    /// the tokens the constraints of `masks` allow. An engine picks on its backend, the masks
    /// computed during the forward (`decode::forward_picks`); the default computes the masks,
    /// then picks on the host from `forward`'s logits.
    fn forward_picks(&mut self, batch: &ForwardBatch, rows: &[RowPick], masks: Vec<MaskJob<'_>>) -> Result<Vec<Picked>, String> {
        let masks = masks_now(rows.len(), masks);
        let logits = self.forward(batch)?;
        pick_on_host(&logits, self.n_vocab(), rows, &masks)
    }
    /// Final hidden states `(batch.logits_rows.len(), n_embd)` (embeddings).
    fn hidden(&mut self, batch: &ForwardBatch) -> Result<Vec<f32>, String>;
    /// A cross-encoder's classification head on `rows` pooled states `(rows, n_embd)`:
    /// scores `(rows, n_classes)`.
    fn classify(&mut self, _pooled: &[f32], _rows: usize) -> Result<Vec<f32>, String> {
        Err("the model has no classification head: it is not a reranking model".into())
    }
    /// Whether tokens attend only to the ones before them (false: an encoder, whose texts
    /// each run whole in one forward).
    fn causal(&self) -> bool {
        true
    }
    /// Recurrent-state slots the model's cache holds (0: no recurrent layers). The last
    /// slot is scratch (embeddings); running requests get one of the others each.
    fn state_slots(&self) -> usize {
        0
    }
    /// Of `state_slots`, how many (the last ones) hold prefix checkpoints.
    fn checkpoint_slots(&self) -> usize {
        0
    }
    /// Recurrent state: (bytes allocated, non-finite values met so far).
    fn state_stats(&self) -> Option<(u64, u64)> {
        None
    }
    /// MoE models: expert selections so far, `[layer][expert]`.
    fn expert_selections(&self) -> Option<Vec<Vec<u64>>> {
        None
    }
    /// MoE routing and Mamba2 conv / scan time since load.
    fn op_times(&self) -> quarrel_models::layers::timing::OpTimes {
        Default::default()
    }
    /// Speculative decoding: how much to draft (None: the model has no drafter).
    fn drafting(&self) -> Option<SpecOptions> {
        None
    }
    /// Drafts for running sequences (keyed by request id), one entry per request; a drafter
    /// that fails drafts nothing this step.
    fn draft(&mut self, _reqs: &[DraftRequest<'_>]) -> Vec<Vec<u32>> {
        vec![]
    }
    /// Request `key` is over: the drafter drops its cache.
    fn release_drafts(&mut self, _key: u64) {}
    /// Copy recurrent state slot `src` to `dst`.
    fn copy_state(&mut self, _src: u32, _dst: u32) -> Result<(), String> {
        Err("the model has no recurrent state".into())
    }
}
