//! A flat forward batch: tokens of several sequences, no batch dimension.

/// The tokens of one sequence within a `ForwardBatch`.
#[derive(Clone, Debug)]
pub struct SeqBatch {
    /// First index of this sequence's tokens in `ForwardBatch::tokens`.
    pub start: usize,
    /// Number of tokens of this sequence in the batch (contiguous).
    pub len: usize,
    /// Physical KV blocks holding this sequence's positions, in order.
    pub block_table: Vec<u32>,
}

/// Input of one model step.
#[derive(Clone, Debug, Default)]
pub struct ForwardBatch {
    pub tokens: Vec<u32>,
    /// Absolute position of every token in its sequence.
    pub positions: Vec<u32>,
    pub seqs: Vec<SeqBatch>,
    /// Token indices whose logits are wanted, in output order.
    pub logits_rows: Vec<usize>,
    /// Recurrent-state slot of each sequence (parallel to `seqs`; empty for models without
    /// recurrent layers). A sequence whose first token in the batch is at position 0 starts
    /// from a zero state; otherwise it continues from what its slot holds.
    pub state_slots: Vec<u32>,
}

impl ForwardBatch {
    pub fn n_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Check internal consistency (every token in exactly one sequence, tables cover positions).
    pub fn validate(&self, block_size: usize) -> Result<(), String> {
        if self.positions.len() != self.tokens.len() {
            return Err(format!("{} tokens but {} positions", self.tokens.len(), self.positions.len()));
        }
        let mut covered = 0;
        for (i, s) in self.seqs.iter().enumerate() {
            if s.start != covered {
                return Err(format!("sequence {i} starts at {} (expected {covered})", s.start));
            }
            covered += s.len;
            if covered > self.tokens.len() {
                return Err(format!("sequence {i} runs past the batch"));
            }
            for &p in &self.positions[s.start..s.start + s.len] {
                if (p as usize) / block_size >= s.block_table.len() {
                    return Err(format!("sequence {i}: position {p} has no KV block"));
                }
            }
        }
        if covered != self.tokens.len() {
            return Err(format!("sequences cover {covered} of {} tokens", self.tokens.len()));
        }
        if !self.state_slots.is_empty() && self.state_slots.len() != self.seqs.len() {
            return Err(format!("{} state slots for {} sequences", self.state_slots.len(), self.seqs.len()));
        }
        if let Some(&r) = self.logits_rows.iter().find(|&&r| r >= self.tokens.len()) {
            return Err(format!("logits row {r} out of range"));
        }
        Ok(())
    }
}
