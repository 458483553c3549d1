//! Quantized KV caches: one fixed calibration pass at load time.
//!
//! The CPU backend takes a per-layer, per-channel key offset out of quantized keys before it
//! quantizes them (keys carry large per-channel offsets common to every token; a 4-bit block
//! would spend its scale on them), and the offset is the mean key of the layer's *first*
//! store. This pass makes that first store a fixed text, so the offset is a property of the
//! model alone: every request, batched or alone, in any order, sees the same cache format.
//! Its blocks are released afterwards; backends without such an offset just compute it.

use crate::engine::{Engine, EngineError};
use quarrel_core::{Backend, ForwardBatch, KvType, SeqBatch};

/// Plain, varied English prose (no fixture text): what a key looks like on average.
const CALIBRATION_TEXT: &str = "The old lighthouse stood at the edge of the harbor for more than a \
century. Every evening the keeper climbed its narrow stairs, trimmed the wick and wound the clockwork \
that turned the great lens. Ships coming home through fog and rain watched for its beam, counted the \
seconds between flashes and knew where they were. When the light was automated in 1962, the keeper \
moved to a small house in town, where he wrote letters to newspapers about tides, weather, and the \
price of bread, and answered every question children asked him about the sea.";

impl<B: Backend> Engine<B> {
    /// Run the calibration text once through the model when the KV cache is quantized.
    pub(crate) fn calibrate_kv(&mut self) -> Result<(), EngineError> {
        if !matches!(self.opts.kv_type, KvType::Q8_0 | KvType::Q4_0) {
            return Ok(());
        }
        let mut tokens = self.tokenize(CALIBRATION_TEXT, true);
        tokens.truncate(self.opts.n_ctx.min(self.opts.n_batch));
        if tokens.is_empty() {
            return Ok(());
        }
        let mut table = vec![];
        let r = (|| {
            self.pool.reserve(&mut table, tokens.len())?;
            let batch = ForwardBatch {
                positions: (0..tokens.len() as u32).collect(),
                seqs: vec![SeqBatch { start: 0, len: tokens.len(), block_table: table.clone() }],
                logits_rows: vec![tokens.len() - 1],
                state_slots: self.state_slots(1)?,
                tokens: tokens.clone(),
            };
            self.model.forward(&self.backend, &batch, &mut self.kv)?;
            Ok(())
        })();
        self.pool.release(&mut table);
        r
    }
}
