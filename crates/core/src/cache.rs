//! What a model asks the engine to allocate for it.

use quarrel_quant::QuantType;

/// Element type of the KV cache. The quantized types store each head's keys and values in
/// 32-element blocks (llama.cpp's `--cache-type-k/-v q8_0|q4_0`), so they need a head
/// dimension that is a multiple of 32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
    Q8_0,
    Q4_0,
}

impl KvType {
    pub const ALL: [KvType; 4] = [KvType::F32, KvType::F16, KvType::Q8_0, KvType::Q4_0];

    pub fn parse(s: &str) -> Option<KvType> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Some(KvType::F32),
            "f16" => Some(KvType::F16),
            "q8_0" => Some(KvType::Q8_0),
            "q4_0" => Some(KvType::Q4_0),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    /// The storage type as a tensor type.
    pub fn quant_type(self) -> QuantType {
        match self {
            KvType::F32 => QuantType::F32,
            KvType::F16 => QuantType::F16,
            KvType::Q8_0 => QuantType::Q8_0,
            KvType::Q4_0 => QuantType::Q4_0,
        }
    }

    /// Bytes of `n` values; `None` when `n` is not a multiple of the type's block.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        self.quant_type().row_bytes(n)
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
        2 * self.n_layer * self.n_kv_head * self.ty.row_bytes(self.head_dim).unwrap_or(0)
    }

    pub fn total_bytes(&self) -> usize {
        self.bytes_per_token() * self.block_size * self.n_blocks
    }
}
