//! What a model asks the engine to allocate for it.

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
}

impl KvType {
    pub fn parse(s: &str) -> Option<KvType> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Some(KvType::F32),
            "f16" => Some(KvType::F16),
            _ => None,
        }
    }

    pub fn bytes(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 => 2,
        }
    }
}

/// A paged KV cache for the attention layers: `n_blocks` blocks of `block_size` token slots,
/// each slot holding `n_kv_head * head_dim` keys and as many values, for every layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvSpec {
    pub n_layer: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub n_blocks: usize,
    pub ty: KvType,
}

impl KvSpec {
    /// Bytes of one token slot across all layers (K and V).
    pub fn bytes_per_token(&self) -> usize {
        2 * self.n_layer * self.n_kv_head * self.head_dim * self.ty.bytes()
    }

    pub fn total_bytes(&self) -> usize {
        self.bytes_per_token() * self.block_size * self.n_blocks
    }
}
