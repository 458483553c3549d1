//! A `ForwardBatch`'s index arrays on the device, uploaded once per batch and shared by
//! `rope`, `kv_store` and `attention` of every layer (one upload per forward, no sync); and the
//! choice of the grouped-query decode attention kernel for batches of many sequences
//! (`kernels/attn_batch.cu`).

use crate::device::{Device, PoolMem};
use crate::error::CudaError;
use quarrel_core::{ForwardBatch, KvType, SeqBatch};

/// Warps the grouped-query decode kernel aims for (about 16 per multiprocessor of an H100).
const GQA_WARPS: usize = 2048;

/// A decode attention launch through `attng_*`: kernel name, grid, position splits and
/// shared memory.
pub(crate) struct GqaLaunch {
    pub name: String,
    pub grid: (u32, u32, u32),
    pub n_split: usize,
    pub smem: u32,
}

/// The grouped-query kernel for a decode batch (one token per sequence) of `n_seqs >= 2`
/// sequences, when it applies: f32 / f16 cache, head_dim 64, 128 or 256, 2 to 8 query heads per
/// KV head, and `QUARREL_CUDA_ATTN_GQA` not `0`. Splits over positions bring the grid to about
/// `GQA_WARPS` warps (at most `max_splits`: they depend on the cache's size only, so decode
/// steps repeat exactly and replay as a graph). `None`: the per-head kernel (`attn1_*`).
pub(crate) fn gqa_decode(n_seqs: usize, ty: KvType, n_head: usize, n_kv_head: usize, hd: usize, max_splits: usize) -> Option<GqaLaunch> {
    if n_seqs < 2 || n_kv_head == 0 || n_head % n_kv_head != 0 || std::env::var("QUARREL_CUDA_ATTN_GQA").is_ok_and(|v| v == "0") {
        return None;
    }
    let g = n_head / n_kv_head;
    let kt = match ty {
        KvType::F32 => "f32",
        KvType::F16 => "f16",
        _ => return None,
    };
    let dpl = match hd {
        64 => 2,
        128 => 4,
        256 => 8,
        _ => return None,
    };
    let gm = match g {
        2 => 2,
        3 | 4 => 4,
        5..=8 => 8,
        _ => return None,
    };
    let blocks = n_seqs * n_kv_head;
    let n_split = GQA_WARPS.div_ceil(blocks).clamp(1, max_splits.clamp(1, 32));
    Some(GqaLaunch {
        name: format!("attng_{kt}_{dpl}_{gm}"),
        grid: (n_seqs as u32, n_kv_head as u32, n_split as u32),
        n_split,
        smem: (4 * g * hd) as u32,
    })
}

/// Kernel names of `attn_batch.cu`.
pub fn kernel_names() -> Vec<String> {
    let mut v = Vec::new();
    for kt in ["f32", "f16"] {
        for dpl in [2, 4, 8] {
            for gm in [2, 4, 8] {
                v.push(format!("attng_{kt}_{dpl}_{gm}"));
            }
        }
    }
    v
}

/// Query tokens per attention tile (ATT_QT in attention.cu).
pub const ATT_QT: usize = 8;

pub struct DevBatch {
    positions: Vec<u32>,
    seqs: Vec<(usize, usize, Vec<u32>)>,
    block_size: usize,
    window: Option<usize>,
    mem: PoolMem,
    pub n_tok: usize,
    pub n_tiles: usize,
    /// (first token, tokens) of each attention tile, as uploaded
    tile_tokens: Vec<(usize, usize)>,
    off_slots: usize,
    off_tiles: usize,
    off_btoff: usize,
    off_bt: usize,
}

impl DevBatch {
    pub fn matches(&self, b: &ForwardBatch, block_size: usize, window: Option<usize>) -> bool {
        self.block_size == block_size
            && self.window == window
            && self.positions == b.positions
            && self.seqs.len() == b.seqs.len()
            && self.seqs.iter().zip(&b.seqs).all(|(a, s)| a.0 == s.start && a.1 == s.len && a.2 == s.block_table)
    }

    pub fn window(&self) -> Option<usize> {
        self.window
    }

    pub fn matches_positions(&self, p: &[u32]) -> bool {
        self.positions == p
    }

    fn at(&self, off: usize) -> u64 {
        self.mem.ptr() + 4 * off as u64
    }
    pub fn pos(&self) -> u64 {
        self.at(0)
    }
    pub fn slots(&self) -> u64 {
        self.at(self.off_slots)
    }
    pub fn tiles(&self) -> u64 {
        self.at(self.off_tiles)
    }
    pub fn bt_off(&self) -> u64 {
        self.at(self.off_btoff)
    }
    pub fn bt(&self) -> u64 {
        self.at(self.off_bt)
    }
    /// (first token, tokens) of each tile of `tiles()`, in its order.
    pub fn tile_tokens(&self) -> &[(usize, usize)] {
        &self.tile_tokens
    }

    /// Validate `b` against a cache of `n_blocks` blocks of `block_size` and upload its arrays.
    pub fn new(dev: &Device, b: &ForwardBatch, block_size: usize, n_blocks: usize, window: Option<usize>) -> Result<DevBatch, CudaError> {
        b.validate(block_size).map_err(CudaError::Shape)?;
        let n = b.n_tokens();
        let mut slots = vec![0u32; n];
        let mut tiles = Vec::new();
        let mut bt_off = Vec::with_capacity(b.seqs.len());
        let mut bt = Vec::new();
        for (si, s) in b.seqs.iter().enumerate() {
            check_table(s, n_blocks)?;
            bt_off.push(bt.len() as u32);
            bt.extend_from_slice(&s.block_table);
            for (slot, &pos) in slots[s.start..s.start + s.len].iter_mut().zip(&b.positions[s.start..s.start + s.len]) {
                let p = pos as usize;
                *slot = (s.block_table[p / block_size] as usize * block_size + p % block_size) as u32;
            }
            let mut t0 = s.start;
            while t0 < s.start + s.len {
                let nq = ATT_QT.min(s.start + s.len - t0);
                tiles.extend_from_slice(&[t0 as u32, nq as u32, si as u32]);
                t0 += nq;
            }
        }
        let n_tiles = tiles.len() / 3;
        let tile_tokens = tiles.chunks_exact(3).map(|t| (t[0] as usize, t[1] as usize)).collect();
        let mut all = Vec::with_capacity(2 * n + tiles.len() + bt_off.len() + bt.len());
        all.extend_from_slice(&b.positions);
        let off_slots = all.len();
        all.extend_from_slice(&slots);
        let off_tiles = all.len();
        all.extend_from_slice(&tiles);
        let off_btoff = all.len();
        all.extend_from_slice(&bt_off);
        let off_bt = all.len();
        all.extend_from_slice(&bt);
        let mem = dev.upload_async(&all)?;
        Ok(DevBatch {
            positions: b.positions.clone(),
            seqs: b.seqs.iter().map(|s| (s.start, s.len, s.block_table.clone())).collect(),
            block_size,
            window,
            mem,
            n_tok: n,
            n_tiles,
            tile_tokens,
            off_slots,
            off_tiles,
            off_btoff,
            off_bt,
        })
    }
}

fn check_table(s: &SeqBatch, n_blocks: usize) -> Result<(), CudaError> {
    if let Some(&b) = s.block_table.iter().find(|&&b| b as usize >= n_blocks) {
        return Err(CudaError::Shape(format!("block table names block {b} of a cache of {n_blocks}")));
    }
    Ok(())
}
