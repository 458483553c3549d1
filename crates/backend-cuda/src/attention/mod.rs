//! Attention on the device: the KV-cache store (fused with RoPE where the model allows) and the
//! attention dispatch — the one-pass kernel with the CPU's numerics (`attn_vec_f16`, short
//! contexts), the split-K kernels and their combine, the grouped-query decode kernel, the tiled
//! prefill kernels — with the constants they share with `kernels/attn_vec.cu`.

use super::*;

/// Positions per chunk of `attn_vec_f16` (AV_CH in kernels/attn_vec.cu).
const VEC_CHUNK: usize = 1024;
/// Positions per group of its chain (AV_G).
const VEC_GROUP: usize = 16;

/// Dynamic shared memory of `attn_vec_f16` (the layout at the top of the kernel): q, three
/// words per position of a chunk, a flag per group, 32 per-warp maxima.
fn attn_vec_smem(hd: usize) -> u32 {
    (4 * (hd + 3 * VEC_CHUNK + VEC_CHUNK / VEC_GROUP + 32)) as u32
}

/// Context length (positions) up to which decode and short-prompt attention over an f16 cache
/// take the one-pass kernel with the CPU's numerics (`attn_vec2_f16`) by default: about where it
/// and split-K + combine take the same time. Longer contexts take the f32 split-K kernel and
/// its combine, whose numerics differ from the CPU's (f32 V accumulator, positions regrouped by
/// the splits). Exact numerics take the one-pass kernel at every length.
pub const VEC_MAX_POSITIONS: usize = 384;

/// Flags of invariant decode steps (`attn_mmid_f16_*`): bit 0 asks for the span's K / V rows
/// into L2 before the PDL wait, bit 1 loads the next 32-position chunk's K / V while computing
/// this one (both faster, the same bits).
const DECODE_FLAGS: i32 = 3;

/// Positions per split of the batch-invariant tensor-core attention (`attn_mmi_f16_*`, invariant
/// numerics): absolute spans [s·256, (s + 1)·256), so a query's partials depend on its own
/// position only. A multiple of the kernel's chunk (AM_KB).
const INV_SPAN: usize = 256;
/// Query positions below `INV_VEC_BELOW` take the one-pass kernel of exact attention in
/// invariant numerics (`attn_vec2_f16`: llama.cpp's CPU order, so short prompts and their decode
/// steps give the CPU's attention bits), positions from it on the tensor-core kernel
/// (`attn_mmi_f16_*`). Both compute a query row from its own position and the cache alone, so
/// the split keeps prompts, decode steps and batches bit-identical. The one-pass kernel has the
/// shorter chain for a decode step at a short context, the tensor-core one the far cheaper
/// prompt rows; 128 keeps prompts within ~3% of the tensor-core kernel alone. A multiple of
/// `batch::TILE_SPAN` (tiles never straddle it).
const INV_VEC_BELOW: u32 = 128;
const _: () = assert!(INV_VEC_BELOW.is_multiple_of(batch::TILE_SPAN));

/// Positions below which invariant numerics' attention takes the one-pass kernel (the
/// tensor-core one from there).
pub fn invariant_one_pass_below() -> usize {
    INV_VEC_BELOW as usize
}

/// Bytes of partials one `attn_mmi_f16_*` launch may write: longer batches are launched in
/// runs of tiles (the same scratch reused in stream order).
const INV_SCRATCH: usize = 256 << 20;

/// The smallest batch (query tokens) whose prefill attention over an f16 cache takes the
/// tensor-core kernel (`attn_mma_f16_*`: f16 q and probabilities, f32 scores, softmax and
/// accumulator) instead of the f32 tiled kernel (the CPU's tiled f32 path starts there too).
/// Exact numerics never take it.
pub const MMA_MIN_TOKENS: usize = 64;

/// The Hadamard rotation size of a quantized cache's rows (0 for f32/f16): quantized caches
/// store each head rotated in blocks of this many values, as the CPU's do.
fn kv_rotation(spec: &KvSpec) -> Result<usize> {
    if !matches!(spec.ty, quarrel_core::KvType::Q8_0 | quarrel_core::KvType::Q4_0) {
        return Ok(0);
    }
    match quarrel_quant::rotate::rotation_size(spec.head_dim) {
        Some(r) if r <= 256 && (spec.n_kv_head * spec.head_dim).is_multiple_of(r) => Ok(r),
        _ => Err(CoreError::Unsupported(format!("{} KV cache with head_dim {}", spec.ty.name(), spec.head_dim))),
    }
}

/// The parameters every paged-attention kernel starts with (kernels/attention.cu ATTN_ARGS,
/// attn_vec.cu): q, k, v, the output, the batch's tiles / positions / block tables, the head
/// shape, the cache's block size, the scale, softcap and sliding window.
fn attn_args(ptrs: [u64; 4], tiles: u64, db: &DevBatch, p: &AttnParams, hd: usize, block_size: usize) -> Vec<Arg> {
    let mut args: Vec<Arg> = ptrs.into_iter().map(Arg::P).collect();
    args.extend([
        Arg::P(tiles),
        Arg::P(db.pos()),
        Arg::P(db.bt_off()),
        Arg::P(db.bt()),
        Arg::I(p.n_head as i32),
        Arg::I(p.n_kv_head as i32),
        Arg::I(hd as i32),
        Arg::I(block_size as i32),
        Arg::F(p.scale),
        Arg::F(p.softcap.unwrap_or(0.0)),
        Arg::I(p.sliding_window.unwrap_or(0) as i32),
    ]);
    args
}

impl CudaBackend {
    pub(crate) fn kv_store_dev(&self, kv: &mut CudaKv, layer: usize, k: &CudaBuf, v: &CudaBuf, batch: &ForwardBatch) -> Result<()> {
        self.dev.bind()?;
        let row = kv.spec.n_kv_head * kv.spec.head_dim;
        if layer >= kv.spec.n_layer {
            return Err(CoreError::Shape(format!("kv_store: layer {layer} of {}", kv.spec.n_layer)));
        }
        if k.len != batch.n_tokens() * row || v.len != k.len {
            return Err(CoreError::Shape(format!("kv_store: k/v have {}/{} values, expected {}", k.len, v.len, batch.n_tokens() * row)));
        }
        let name = format!("kv_store_{}", kv::kv_name(kv.spec.ty));
        let n = batch.n_tokens();
        if n == 0 {
            return Ok(());
        }
        let (kp, vp) = (kv.k[layer].ptr, kv.v[layer].ptr);
        let (ks, vs) = (self.rd(k)?, self.rd(v)?);
        let rot = kv_rotation(&kv.spec)?;
        // quantized keys: the layer's first store sets its key offset (the per-channel mean of
        // the keys, summed in f64 in token order as the CPU does; one download, once per layer)
        if rot > 0 && kv.k_off[layer].is_none() {
            let keys: Vec<f32> = self.dev.download(ks, k.len)?;
            let mut sum = vec![0f64; row];
            for x in keys.chunks_exact(row) {
                sum.iter_mut().zip(x).for_each(|(a, &b)| *a += b as f64);
            }
            let m: Vec<f32> = sum.iter().map(|s| (s / n as f64) as f32).collect();
            kv.k_off[layer] = Some(crate::runtime::DevMem::upload(&self.dev, &m)?);
        }
        let koff = kv.k_off[layer].as_ref().map_or(0, |m| m.ptr);
        // f32/f16: a thread per value; quantized: a warp per rotation block (8 to a block)
        let blocks = match (n * row).checked_div(rot) {
            None => ((n * row) as u64).div_ceil(256),
            Some(warps) => (warps as u64).div_ceil(8),
        };
        self.with_batch(batch, kv, None, |db| {
            // RoPE of q and this k still held (whole heads rotated, same tokens): one launch
            // rotates q and k and stores k and v (f32/f16 caches)
            let fits = |a: &[Arg]| {
                a[10].bits() == ks && a[3].bits() == n as u64 && a[5].bits() == a[6].bits() && (a[11].bits() * a[5].bits()) as usize == row
            };
            // k and v of a held q/k/v GEMV that rotates q and k: stored by its epilogue
            if rot == 0 && kv::kv_name(kv.spec.ty) == "f16" && crate::matmul::rope_fusion() {
                if let Some(Held::Gemv(mut g)) = self.dev.take_held_if(|h| matches!(h, Held::Gemv(g) if g.kv_fits(ks, vs, n, row))) {
                    g.add_kv(kp, vp, db.slots());
                    return Ok(self.dev.hold(Held::Gemv(g))?);
                }
            }
            if rot == 0 {
                if let Some(Held::RopeQk { args, n: pairs }) =
                    self.dev.take_held_if(|h| matches!(h, Held::RopeQk { args, .. } if fits(args)))
                {
                    // rope's arguments without n_rot (= hd) and x2's slot order kept
                    let mut a: Vec<Arg> = args[..6].iter().chain(&args[7..12]).copied().collect();
                    a.extend([Arg::P(kp), Arg::P(vp), Arg::P(vs), Arg::P(db.slots()), Arg::I(row as i32)]);
                    let threads = pairs + (n * row) as u64;
                    let kname = format!("rope_kv_{}", kv::kv_name(kv.spec.ty));
                    return Ok(self.dev.launch_now(&kname, (threads.div_ceil(256) as u32, 1, 1), 256, 0, &a)?);
                }
            }
            let args = [
                Arg::P(kp),
                Arg::P(ks),
                Arg::P(vp),
                Arg::P(vs),
                Arg::P(db.slots()),
                Arg::I(row as i32),
                Arg::I(n as i32),
                Arg::I(rot as i32),
                Arg::P(koff),
            ];
            self.dev.launch(&name, (blocks as u32, 2, 1), 256, 0, &args)?;
            Ok(())
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_dev(
        &self,
        q: &CudaBuf,
        kv: &CudaKv,
        layer: usize,
        batch: &ForwardBatch,
        p: &AttnParams,
        sinks: Option<&CudaBuf>,
        out: &mut CudaBuf,
    ) -> Result<()> {
        self.dev.bind()?;
        let hd = p.head_dim;
        check_len("attention q", q.len, batch.n_tokens() * p.n_head * hd)?;
        check_len("attention output", out.len, q.len)?;
        if let Some(s) = sinks {
            check_len("attention sinks", s.len, p.n_head)?;
        }
        // sinks join the softmax in the combine of the split-K partials: the one-pass kernel and
        // invariant numerics' kernels (which normalize their rows themselves) are not taken
        let sinks_ptr = match sinks {
            Some(s) => self.rd(s)?,
            None => 0,
        };
        if hd != kv.spec.head_dim || p.n_kv_head != kv.spec.n_kv_head || p.n_kv_head == 0 || !p.n_head.is_multiple_of(p.n_kv_head) {
            return Err(CoreError::Shape(format!(
                "attention: {} heads / {} kv heads of {hd} vs cache {} x {}",
                p.n_head, p.n_kv_head, kv.spec.n_kv_head, kv.spec.head_dim
            )));
        }
        if layer >= kv.spec.n_layer {
            return Err(CoreError::Shape(format!("attention: layer {layer} of {}", kv.spec.n_layer)));
        }
        let dpl = match hd {
            0 => return Err(CoreError::Shape("attention: head_dim 0".into())),
            1..=64 => 2,
            65..=128 => 4,
            129..=256 => 8,
            _ => return Err(CoreError::Unsupported(format!("attention with head_dim {hd} (the GPU kernel takes up to 256)"))),
        };
        if batch.n_tokens() == 0 {
            return Ok(());
        }
        // every sequence one token (decode): the kernel for one query per tile
        let one = batch.seqs.iter().all(|s| s.len <= 1);
        // shared memory holds ATT_QT query rows in the tiled kernels (Ks follows them)
        let qt = if one { 1 } else { batch::ATT_QT };
        let kind = if one { "1" } else { "" };
        let name = format!("attn{kind}_{}_{dpl}", kv::kv_name(kv.spec.ty));
        let rot = kv_rotation(&kv.spec)?;
        // ggml's vector path over an f16 cache (q rounded to f16, the V accumulator in f16;
        // kernels/attention.cu, attn_vec.cu): llama.cpp's CPU takes it for sequences shorter
        // than 64 tokens and every decode step, the tiled f32 one for longer prompts. By default
        // so does this backend; exact numerics (`set_exact_attention`) take the vector path at
        // every length, as the CPU backend's default does: a prompt of any length then gives
        // the bits of the same tokens decoded one by one
        let exact = self.exact_attn();
        let vec_path = kv.spec.ty == quarrel_core::KvType::F16 && (exact || batch.seqs.iter().all(|s| s.len < 64));
        // `attn_vec2_f16` (kernels/attn_vec.cu): that path's numerics in one pass per (token,
        // head), by default up to `attn_vec_max` positions, at every length in exact mode
        // (by default not for decode batches of many sequences, whose blocks would fill more than
        // one wave of the GPU: the grouped split-K kernel is faster there, by up to 8% of
        // decode time)
        let n_ctx = batch.positions.iter().max().map_or(0, |&p| p as usize + 1);
        let one_wave = !one || batch.seqs.len() == 1 || batch.seqs.len() * p.n_head <= 2 * self.dev.n_sm;
        let offsets_fit = (kv.spec.n_blocks * kv.spec.block_size * kv.spec.n_kv_head * hd) < u32::MAX as usize;
        let vec = vec_path
            && sinks.is_none()
            && hd.is_multiple_of(8)
            && offsets_fit
            && (exact || (one_wave && n_ctx <= self.attn_vec_max.load(std::sync::atomic::Ordering::Relaxed)));
        // exact mode with a head_dim the one-pass kernel does not take: the tiled kernel's
        // vector path (one warp per tile and head, no split)
        let q16 = exact && vec_path && !vec;
        let (kp, vp) = (kv.k[layer].ptr, kv.v[layer].ptr);
        let koff = kv.k_off[layer].as_ref().map_or(0, |m| m.ptr);
        let (qp, op) = (self.rd(q)?, self.wr(out));
        // invariant numerics: the tensor-core kernel with absolute splits at every token count
        // (a shape it does not take keeps the one-pass kernel of exact attention, also invariant)
        let group = p.n_head / p.n_kv_head;
        if sinks.is_none()
            && self.invariant_mm()
            && kv.spec.ty == quarrel_core::KvType::F16
            && matches!(hd, 64 | 128 | 256)
            && group <= 16
            && offsets_fit
        {
            return self.attention_invariant([qp, kp, vp, op], q.len, kv, batch, p);
        }
        if vec {
            return self.with_batch(batch, kv, p.sliding_window, |db| {
                let q8 = if hd.is_multiple_of(32) { self.q8_out(op, q.len)? } else { (0, 0) };
                self.attn_vec_launch([qp, kp, vp, op], (db.tiles(), db.n_tiles), one, db, p, kv.spec.block_size, q8)
            });
        }
        self.with_batch(batch, kv, p.sliding_window, |db| {
            // split-K: enough blocks to fill the GPU; the count depends on the cache's size only
            // (each block sizes its share from the positions on the device), so decode steps
            // repeat exactly and replay as a graph
            let blocks = db.n_tiles * p.n_head;
            let max_splits = (kv.spec.n_blocks * kv.spec.block_size).div_ceil(64).max(1);
            // decode batches of several sequences: one warp per (sequence, KV head) serves its
            // query heads (batch.rs: gqa_decode; f32 accumulation, not the vector path's f16)
            // (not in exact mode's vector path: ggml accumulates V in f16, position by position)
            let gqa = if one && !q16 && self.gqa_decode.load(std::sync::atomic::Ordering::Relaxed) {
                batch::gqa_decode(db.n_tiles, kv.spec.ty, p.n_head, p.n_kv_head, hd, max_splits)
            } else {
                None
            };
            // prefill over an f16 cache: the tensor-core kernel (attn_mma.cu), one block of
            // ceil(group / 2) warps per (tile, KV head, split); not in exact mode
            let group = p.n_head / p.n_kv_head;
            let mma = !one
                && !exact
                && !q16
                && kv.spec.ty == quarrel_core::KvType::F16
                && matches!(hd, 64 | 128 | 256)
                && group <= 16
                && batch.n_tokens() >= self.attn_mma_min.load(std::sync::atomic::Ordering::Relaxed);
            let mut threads = 32;
            let (name, grid, n_split, smem) = match gqa {
                Some(g) => (g.name, g.grid, g.n_split, g.smem),
                None if mma => {
                    threads = 32 * group.div_ceil(2) as u32;
                    let n_split = 1024usize.div_ceil(db.n_tiles * p.n_kv_head).clamp(1, max_splits.min(32));
                    (format!("attn_mma_f16_{hd}"), (db.n_tiles as u32, p.n_kv_head as u32, n_split as u32), n_split, 0)
                }
                None => {
                    // exact mode's vector path: one pass over the positions (ggml's f16 V
                    // accumulator is rounded position by position; splits would regroup it)
                    let n_split = if q16 { 1 } else { 512usize.div_ceil(blocks).clamp(1, max_splits.min(32)) };
                    (name, (db.n_tiles as u32, p.n_head as u32, n_split as u32), n_split, (4 * (qt * hd + 2 * 32 * (hd + 1))) as u32)
                }
            };
            let part = self.dev.scratch(4 * batch.n_tokens() * p.n_head * n_split * (hd + 2))?;
            let mut args = attn_args([qp, kp, vp, part.ptr()], db.tiles(), db, p, hd, kv.spec.block_size);
            // attng_* (gqa) and attn_mma_f16_* take the same parameters as attn_* / attn1_*
            args.extend([Arg::I(rot as i32), Arg::I(q16 as i32), Arg::P(koff)]);
            self.dev.launch(&name, grid, threads, smem, &args)?;
            let (xq, xm) = if hd.is_multiple_of(32) { self.q8_out(op, q.len)? } else { (0, 0) };
            Ok(self.attn_combine(part.ptr(), op, batch.n_tokens(), p, n_split, (xq, xm), sinks_ptr)?)
        })
    }
}

impl CudaBackend {
    /// `attn_combine`: the `n_split` partials of `n_tok` tokens' heads at `part` into the rows
    /// at `out` and their Q8 form (`q8`: (0, 0) none; else the head dim is a multiple of 32),
    /// with the heads' sink logits at `sinks` (0: none).
    #[allow(clippy::too_many_arguments)]
    fn attn_combine(
        &self,
        part: u64,
        out: u64,
        n_tok: usize,
        p: &AttnParams,
        n_split: usize,
        (xq, xm): (u64, u64),
        sinks: u64,
    ) -> Result<(), CudaError> {
        let hd = p.head_dim;
        self.dev.launch(
            "attn_combine",
            ((n_tok * p.n_head) as u32, 1, 1),
            if hd.is_multiple_of(32) { hd as u32 } else { 256 },
            0,
            &[
                Arg::P(part),
                Arg::P(out),
                Arg::I(p.n_head as i32),
                Arg::I(hd as i32),
                Arg::I(n_split as i32),
                Arg::P(xq),
                Arg::P(xm),
                Arg::P(sinks),
            ],
        )
    }

    /// The one-pass kernel (`attn_vec2_f16`) over `n_tiles` tiles at `tiles`
    /// (`db.tiles()` or a part of it in its layout), writing the rows and their Q8 form (`q8`:
    /// (0, 0) none).
    #[allow(clippy::too_many_arguments)]
    fn attn_vec_launch(
        &self,
        ptrs: [u64; 4],
        (tiles, n_tiles): (u64, usize),
        one: bool,
        db: &DevBatch,
        p: &AttnParams,
        block_size: usize,
        (xq, xm): (u64, u64),
    ) -> Result<()> {
        let hd = p.head_dim;
        // the scores and the scan spread over all threads, the chain over hd of them: 256 where
        // few blocks run (one per SM), 128 (or hd) where many do (two 256-thread blocks fill an
        // SM's registers); the thread count never changes a row's arithmetic
        let blocks = n_tiles * p.n_head;
        let threads = if blocks >= 512 { hd.div_ceil(32).max(4) as u32 * 32 } else { 256 };
        let mut args = attn_args(ptrs, tiles, db, p, hd, block_size);
        args.extend([Arg::P(xq), Arg::P(xm)]);
        let per_tile = if one { 1 } else { batch::ATT_QT as u32 };
        self.dev.launch("attn_vec2_f16", (n_tiles as u32, p.n_head as u32, per_tile), threads, attn_vec_smem(hd), &args)?;
        Ok(())
    }

    /// Attention in invariant numerics: rows of positions below `INV_VEC_BELOW` by the one-pass
    /// kernel, the others as `attention_mmi`. A batch of both kinds runs `attention_mmi` over
    /// every row, then the one-pass kernel over the low tiles, whose rows
    /// it writes again (their tensor-core values discarded: simpler than a combine that skips
    /// rows, and only prompts that cross the boundary pay for it).
    fn attention_invariant(&self, ptrs: [u64; 4], q_len: usize, kv: &CudaKv, batch: &ForwardBatch, p: &AttnParams) -> Result<()> {
        let hd = p.head_dim;
        let one = batch.seqs.iter().all(|s| s.len <= 1);
        let q8 = if hd.is_multiple_of(32) { self.q8_out(ptrs[3], q_len)? } else { (0, 0) };
        let below = INV_VEC_BELOW;
        let n_low = batch.positions.iter().filter(|&&x| x < below).count();
        if n_low == batch.n_tokens() {
            return self.with_batch(batch, kv, p.sliding_window, |db| {
                self.attn_vec_launch(ptrs, (db.tiles(), db.n_tiles), one, db, p, kv.spec.block_size, q8)
            });
        }
        if n_low == 0 {
            return self.attention_mmi(ptrs, q8, kv, batch, p);
        }
        self.attention_mmi(ptrs, q8, kv, batch, p)?;
        self.with_batch(batch, kv, p.sliding_window, |db| {
            let (tiles, n) = db.low_tiles(below);
            self.attn_vec_launch(ptrs, (tiles, n), one, db, p, kv.spec.block_size, q8)
        })
    }

    /// Attention in invariant numerics (`attn_mmi_f16_*` then `attn_combine`): the partials of
    /// absolute spans of `INV_SPAN` positions, merged in span order (one span: normalized by the
    /// kernel itself with the combine's arithmetic), as many spans as the batch's latest
    /// position needs (decode grids change every `INV_SPAN` positions: a graph is captured
    /// again then). Spans past a query's position are masked for it (skipped by the combine),
    /// so the batch's other queries never change its bits.
    fn attention_mmi(
        &self,
        [qp, kp, vp, op]: [u64; 4],
        (xq, xm): (u64, u64),
        kv: &CudaKv,
        batch: &ForwardBatch,
        p: &AttnParams,
    ) -> Result<()> {
        let hd = p.head_dim;
        let n_ctx = batch.positions.iter().max().map_or(0, |&x| x as usize + 1);
        let n_split = n_ctx.div_ceil(INV_SPAN).max(1);
        // a warp per two query heads of the KV head (the m16 rows: 8 tokens x 2 heads); decode
        // steps (one token per tile: 2 of a warp's 16 rows) take at least 4 warps, the extra ones
        // only staging K / V (the thread count never changes a row's arithmetic)
        let one = batch.seqs.iter().all(|s| s.len <= 1);
        let threads = 32 * (p.n_head / p.n_kv_head).div_ceil(2).max(if one { 4 } else { 1 }) as u32;
        let per_token = 4 * p.n_head * n_split * (hd + 2);
        let max_tok = (INV_SCRATCH / per_token).max(batch::ATT_QT);
        self.with_batch(batch, kv, p.sliding_window, |db| {
            // decode steps: hd / 32 blocks per KV head, 32 output dims each (attn_mmid_f16_*)
            let nds = if one && matches!(hd, 64 | 128 | 256) { hd / 32 } else { 1 };
            let kname = if nds > 1 { format!("attn_mmid_f16_{hd}") } else { format!("attn_mmi_f16_{hd}") };
            let gy = (p.n_kv_head * nds) as u32;
            let args = |part: u64, tiles: u64, first: usize, (o, q, m): (u64, u64, u64)| {
                vec![
                    Arg::P(qp),
                    Arg::P(kp),
                    Arg::P(vp),
                    Arg::P(part),
                    Arg::P(tiles),
                    Arg::P(db.pos()),
                    Arg::P(db.bt_off()),
                    Arg::P(db.bt()),
                    Arg::I(p.n_head as i32),
                    Arg::I(p.n_kv_head as i32),
                    Arg::I(kv.spec.block_size as i32),
                    Arg::F(p.scale),
                    Arg::F(p.softcap.unwrap_or(0.0)),
                    Arg::I(p.sliding_window.unwrap_or(0) as i32),
                    Arg::I(INV_SPAN as i32),
                    Arg::I(first as i32),
                    Arg::P(o),
                    Arg::P(q),
                    Arg::P(m),
                    Arg::I(DECODE_FLAGS),
                ]
            };
            if n_split == 1 {
                // one span: the kernel normalizes the rows itself (the combine's bits for one split)
                let a = args(0, db.tiles(), 0, (op, xq, xm));
                return Ok(self.dev.launch(&kname, (db.n_tiles as u32, gy, 1), threads, 0, &a)?);
            }
            let tiles = db.tile_tokens();
            let whole = tiles.last().map_or(0, |&(t0, nq)| t0 + nq) - tiles.first().map_or(0, |t| t.0);
            let part = self.dev.scratch(per_token * whole.min(max_tok))?;
            let mut a = 0;
            while a < tiles.len() {
                // tiles [a, b): the tokens whose partials fit the scratch
                let first = tiles[a].0;
                let mut b = a + 1;
                while b < tiles.len() && tiles[b].0 + tiles[b].1 - first <= max_tok {
                    b += 1;
                }
                let n_tok = tiles[b - 1].0 + tiles[b - 1].1 - first;
                let launch_args = args(part.ptr(), db.tiles() + 12 * a as u64, first, (0, 0, 0));
                self.dev.launch(&kname, ((b - a) as u32, gy, n_split as u32), threads, 0, &launch_args)?;
                let values = (first * p.n_head * hd) as u64;
                let (xq_at, xm_at) = if xq == 0 { (0, 0) } else { (xq + values, xm + 8 * (values / 32)) };
                // hd is 64, 128 or 256 here: the combine runs hd threads
                self.attn_combine(part.ptr(), op + 4 * values, n_tok, p, n_split, (xq_at, xm_at), 0)?;
                a = b;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    /// The kernel's chunk and group sizes are the host's (the shared memory it is given is
    /// sized from them: a mismatch reads past the allocation).
    #[test]
    fn attn_vec_constants_match_the_kernel() {
        let src = include_str!("../../kernels/attn_vec.cu");
        let define = |name: &str| crate::kernels::kernel_define(src, name);
        assert_eq!(define("AV_CH"), super::VEC_CHUNK);
        assert_eq!(define("AV_G"), super::VEC_GROUP);
        assert_eq!(super::VEC_CHUNK % (2 * super::VEC_GROUP), 0);
        // q (hd), W, MS, SLOT (3 per position), NEWG (one per group), RED (32)
        assert_eq!(super::attn_vec_smem(128), 4 * (128 + 3 * 1024 + 1024 / 16 + 32));
    }
}
