//! A `ForwardBatch`'s index arrays on the device, uploaded once per batch and shared by
//! `rope`, `kv_store` and `attention` of every layer (one upload per forward, no sync); and the
//! choice of the grouped-query decode attention kernel for batches of many sequences
//! (`kernels/attn_batch.cu`).

use crate::error::CudaError;
use crate::fusion::Device;
use crate::runtime::PoolMem;
use quarrel_core::{ForwardBatch, KvType, SeqBatch};

/// Warps the grouped-query decode kernel aims for (about 16 per multiprocessor of a large GPU).
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
/// KV head. Splits over positions bring the grid to about
/// `GQA_WARPS` warps (at most `max_splits`: they depend on the cache's size only, so decode
/// steps repeat exactly and replay as a graph). `None`: the per-head kernel (`attn1_*`).
pub(crate) fn gqa_decode(n_seqs: usize, ty: KvType, n_head: usize, n_kv_head: usize, hd: usize, max_splits: usize) -> Option<GqaLaunch> {
    if n_seqs < 2 || n_kv_head == 0 || !n_head.is_multiple_of(n_kv_head) {
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

/// Query tokens per attention tile (ATT_QT in attention.cu).
pub const ATT_QT: usize = 8;

/// Tiles never straddle a multiple of this many positions (a tile's tokens all lie in one
/// `TILE_SPAN`-position span): invariant attention takes one kernel for the positions below a
/// multiple of it and another from there on (attn.rs `INV_VEC_BELOW`), a tile at a time.
pub const TILE_SPAN: u32 = 64;

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
    /// The tiles again, ordered by their first position (stable), with those positions: the
    /// tiles below a position are a prefix of it (`low_tiles`)
    by_pos: Vec<u32>,
    off_slots: usize,
    off_tiles: usize,
    off_by_pos: usize,
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
    /// The tiles whose positions lie below `below` (a multiple of `TILE_SPAN`), in `tiles()`'s
    /// layout: (pointer, count).
    pub fn low_tiles(&self, below: u32) -> (u64, usize) {
        (self.at(self.off_by_pos), self.by_pos.partition_point(|&p| p < below))
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
            seq_tiles(&b.positions, s.start, s.len, si, &mut tiles);
        }
        let n_tiles = tiles.len() / 3;
        let mut order: Vec<usize> = (0..n_tiles).collect();
        order.sort_by_key(|&i| b.positions[tiles[3 * i] as usize]);
        let by_pos: Vec<u32> = order.iter().map(|&i| b.positions[tiles[3 * i] as usize]).collect();
        let tiles_by_pos: Vec<u32> = order.iter().flat_map(|&i| tiles[3 * i..3 * i + 3].iter().copied()).collect();
        let tile_tokens = tiles.chunks_exact(3).map(|t| (t[0] as usize, t[1] as usize)).collect();
        let mut all = Vec::with_capacity(2 * n + 2 * tiles.len() + bt_off.len() + bt.len());
        all.extend_from_slice(&b.positions);
        let off_slots = all.len();
        all.extend_from_slice(&slots);
        let off_tiles = all.len();
        all.extend_from_slice(&tiles);
        let off_by_pos = all.len();
        all.extend_from_slice(&tiles_by_pos);
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
            by_pos,
            off_slots,
            off_tiles,
            off_by_pos,
            off_btoff,
            off_bt,
        })
    }
}

/// Tiles (first token, tokens, sequence) of sequence `si`'s tokens [start, start + len): runs of
/// up to ATT_QT tokens, each within one `TILE_SPAN`-position span of its first token.
fn seq_tiles(positions: &[u32], start: usize, len: usize, si: usize, tiles: &mut Vec<u32>) {
    let mut t0 = start;
    while t0 < start + len {
        let span = positions[t0] / TILE_SPAN;
        let nq = (t0..(t0 + ATT_QT).min(start + len)).take_while(|&t| positions[t] / TILE_SPAN == span).count();
        tiles.extend_from_slice(&[t0 as u32, nq as u32, si as u32]);
        t0 += nq;
    }
}

fn check_table(s: &SeqBatch, n_blocks: usize) -> Result<(), CudaError> {
    if let Some(&b) = s.block_table.iter().find(|&&b| b as usize >= n_blocks) {
        return Err(CudaError::Shape(format!("block table names block {b} of a cache of {n_blocks}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tiles cover a sequence's tokens in order, at most ATT_QT each, none across a multiple of
    /// TILE_SPAN positions (invariant attention's kernel choice is per tile).
    #[test]
    fn tiles_cover_tokens_and_never_straddle_a_span() {
        for (p0, len) in [(0u32, 1usize), (0, 700), (250, 20), (255, 2), (256, 9), (1000, 300), (7, 249)] {
            let positions: Vec<u32> = (0..len as u32).map(|i| p0 + i).collect();
            let mut tiles = vec![];
            seq_tiles(&positions, 0, len, 3, &mut tiles);
            let mut next = 0;
            for t in tiles.chunks_exact(3) {
                let (t0, nq) = (t[0] as usize, t[1] as usize);
                assert_eq!((t0, t[2]), (next, 3));
                assert!((1..=ATT_QT).contains(&nq));
                assert_eq!(positions[t0] / TILE_SPAN, positions[t0 + nq - 1] / TILE_SPAN, "tile at {t0} of {nq} from position {p0}");
                next = t0 + nq;
            }
            assert_eq!(next, len);
        }
        // runs of ATT_QT away from a boundary
        let mut tiles = vec![];
        seq_tiles(&(0..16).collect::<Vec<u32>>(), 0, 16, 0, &mut tiles);
        assert_eq!(tiles, [0, 8, 0, 8, 8, 0]);
        // a run broken at 256
        let mut tiles = vec![];
        seq_tiles(&(250..262).collect::<Vec<u32>>(), 0, 12, 0, &mut tiles);
        assert_eq!(tiles, [0, 6, 0, 6, 6, 0]);
    }
}
