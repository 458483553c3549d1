//! What the debug examples share: a model on the CPU backend with a small F16 KV cache, fed one
//! sequence chunk by chunk.

use quarrel_core::{Backend, ForwardBatch, KvSpec, KvType, SeqBatch};
use quarrel_cpu::CpuBackend;

/// KV blocks of 16 positions: room for 1024.
const N_BLOCKS: usize = 64;

/// One sequence of the model at `path`, positions counted across `forward` calls.
pub struct Session {
    be: CpuBackend,
    model: Box<dyn quarrel_models::Model<CpuBackend>>,
    kv: <CpuBackend as Backend>::Kv,
    pos: u32,
}

impl Session {
    pub fn open(path: &str) -> Self {
        let g = std::sync::Arc::new(quarrel_gguf::Gguf::open(path).expect("open"));
        let be = CpuBackend::new(0).expect("backend");
        let model = quarrel_models::load(&be, &g).expect("load");
        let info = model.info().clone();
        let spec = KvSpec {
            n_layer: info.n_layer,
            n_kv_head: info.n_kv_head,
            head_dim: info.head_dim,
            block_size: 16,
            n_blocks: N_BLOCKS,
            ty: KvType::F16,
        };
        let kv = be.alloc_kv(&spec).expect("kv");
        Session { be, model, kv, pos: 0 }
    }

    /// Run `tokens` as the next positions; the logits of the chunk's rows `logits_rows`.
    pub fn forward(&mut self, tokens: &[u32], logits_rows: Vec<usize>) -> Vec<f32> {
        let n = tokens.len();
        let b = ForwardBatch {
            tokens: tokens.to_vec(),
            positions: (self.pos..self.pos + n as u32).collect(),
            seqs: vec![SeqBatch { start: 0, len: n, block_table: (0..N_BLOCKS as u32).collect() }],
            logits_rows,
            state_slots: vec![],
        };
        self.pos += n as u32;
        self.model.forward(&self.be, &b, &mut self.kv).expect("forward")
    }
}
