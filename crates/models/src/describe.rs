//! What a model is, read from its metadata before any weight is loaded: the facts a caller
//! chooses load-time settings by. A backend's numerics are one: they must be set before the
//! weights load, and a model whose routing or recurrent state would carry a rounding difference
//! between a prompt and its tokens one by one needs batch-invariant ones by default.

use quarrel_core::{Numerics, Result};
use quarrel_gguf::Gguf;

/// A model's description from its GGUF metadata (no tensor is read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelDescription {
    /// `general.architecture`.
    pub arch: String,
    /// Routed experts (`{arch}.expert_count` > 0): each token's experts are chosen from its
    /// router logits, so a rounding can change the choice.
    pub routed_experts: bool,
    /// Recurrent (Mamba2) layers (`{arch}.ssm.*`): state carried from token to token.
    pub recurrent_state: bool,
    /// An encoder (BERT family: every token sees the whole text; vectors, no logits): its
    /// results are compared by cosine, so the CPU may multiply its F16 weights on matrix units
    /// in another float order than llama.cpp's.
    pub encoder: bool,
}

impl ModelDescription {
    pub fn from_gguf(g: &Gguf) -> Result<ModelDescription> {
        let arch = g.architecture()?.to_string();
        let routed_experts = g.get_u64(&format!("{arch}.expert_count")).ok().flatten().unwrap_or(0) > 0;
        let recurrent_state = g.get(&format!("{arch}.ssm.conv_kernel")).is_some();
        let encoder = crate::ENCODER_ARCHITECTURES.contains(&arch.as_str());
        Ok(ModelDescription { arch, routed_experts, recurrent_state, encoder })
    }

    /// The numerics this model runs with unless the user chooses: invariant with routed
    /// experts or recurrent state, fast otherwise (`Numerics::for_model`).
    pub fn default_numerics(&self) -> Numerics {
        Numerics::for_model(self.routed_experts, self.recurrent_state)
    }
}
