// Prefill attention on the tensor cores over the paged f16 cache (flash attention,
// mma.sync m16n8k16: f16 x f16 -> f32). One block per (query tile of up to 8 tokens, KV head,
// position split); warp w takes the tile's tokens for query heads 2w and 2w + 1 of that KV
// head's group (the m16 rows: row r = token r % 8 of head 2w + r / 8), so all the group's
// heads share each K/V tile the block stages in shared memory (K row-major, V transposed, as
// f16). q is rounded to f16 in registers (the A fragments); scores, the online softmax (scale,
// softcap, causal mask and sliding window as attention.cu's f32 kernel) and the output
// accumulator are f32, the probabilities rounded to f16 for P·V. Writes attention.cu's
// partials (m, l, acc) per (token, head, split); `attn_combine` merges and normalizes them.
// Its plain twin is attention.cu's f32 kernel (`attn_f16_*`, the crate's tests compare them).
//
// Batch-invariant flavour (`attn_mmi_f16_*`, invariant numerics, src/attention/mod.rs): the splits are
// absolute spans of `span` positions (split s: [s·span, (s + 1)·span)) and the chunks of AM_KB
// positions absolute multiples too, so a row's partials depend on its own position only: every
// m16 row's scores, maxima, sums and P·V products come from that row's q and the chunk's K / V
// alone (an mma's row never sees the other rows), and a chunk masked for a row (past its
// position, before its window) leaves its m, l and accumulator exactly as they were (factor
// exp(0) = 1, probabilities 0). A decode step (one query per tile) and a prompt tile of eight
// give the same partials, `attn_combine` merges them in split order (masked splits skipped).

#define AM_KB 32
#define AM_LD 4  // K / V pieces per thread in flight while staging a chunk (2 at head_dim 256: registers)

__device__ __forceinline__ void mma_f16_k16(float (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two floats as an f16 pair (lo in the low half), round to nearest.
__device__ __forceinline__ u32 am_pack(float lo, float hi) { return (u32)f2h(lo) | ((u32)f2h(hi) << 16); }

__device__ __forceinline__ float am_max4(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float am_sum4(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Score -> masked, scaled (and softcapped) logit of position p for a row at position pq
// whose window starts at lq (pq < 0: a padding row, everything masked).
__device__ __forceinline__ float am_logit(float s, int p, int pq, int lq, float scale, float softcap) {
    float sc = s * scale;
    if (softcap > 0.f) sc = softcap * tanhf(sc / softcap);
    return (p <= pq && p >= lq) ? sc : -INF;
}

// Parameters as attention.cu's ATTN_ARGS (rot, q16, koff unused: f16 cache, f32 path).
template <int HD, int NDS = 1>
__device__ __forceinline__ void attn_mma(const float* __restrict__ q, const u8* __restrict__ K, const u8* __restrict__ V,
                                         float* __restrict__ part, const u32* __restrict__ tiles, const u32* __restrict__ pos,
                                         const u32* __restrict__ bt_off, const u32* __restrict__ bt, int n_head, int n_kv_head,
                                         int bs, float scale, float softcap, int window, int span, int tok_base,
                                         float* __restrict__ out, i8* __restrict__ xq, float2* __restrict__ xm, int pf = 0) {
    // prompts wait for the previous kernel at once; decode steps first ask for their K / V rows
    if (NDS == 1) GDC();
    __shared__ __align__(16) u16 Ks[AM_KB][HD + 8];  // [position][dim]
    __shared__ __align__(16) u16 Vt[HD][AM_KB + 8];  // [dim][position]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t = lane & 3;
    // the latest tiles (most positions) first
    const int tile = gridDim.x - 1 - blockIdx.x;
    // NDS > 1 (decode steps, attn_mmid_*): blockIdx.y = kvh * NDS + ds, and the block computes
    // P·V and the output for the dims of n8 tiles [ds * NPT, (ds + 1) * NPT) only (S, the
    // softmax and every row's arithmetic as with NDS = 1: the same bits, NDS times the blocks)
    constexpr int NPT = HD / 8 / NDS;
    const int kvh = blockIdx.y / NDS, ds = blockIdx.y % NDS, n_lo = ds * NPT;
    const int split = blockIdx.z, n_split = gridDim.z;
    const int grp = n_head / n_kv_head;
    const u32 t0 = tiles[3 * tile], nq = tiles[3 * tile + 1], seq = tiles[3 * tile + 2];
    int hi = 0, lo = 0x7fffffff;
    for (u32 i = 0; i < nq; i++) {
        int p = (int)pos[t0 + i];
        hi = max(hi, p);
        lo = min(lo, window > 0 ? max(0, p + 1 - window) : 0);
    }
    int p_begin, p_end;
    if (span > 0) {  // absolute spans and chunks (span % AM_KB == 0); skipped chunks are masked for every row
        p_begin = max(split * span, lo / AM_KB * AM_KB);
        p_end = min(hi + 1, (split + 1) * span);
    } else {
        const int split_len = ((hi + 1 - lo + n_split - 1) / n_split + AM_KB - 1) / AM_KB * AM_KB;
        p_begin = lo + split * split_len;
        p_end = min(hi + 1, p_begin + split_len);
    }
    const u64 row = (u64)n_kv_head * HD;
    const u32* table = bt + bt_off[seq];
    if (NDS > 1) {
        // decode steps (pf & 1): the span's K rows (a share per block of the KV head's NDS) and this
        // block's V dims on their way to L2 before the PDL wait, so that the chunk loop's loads
        // find them there. The batch arrays were uploaded before the step and the cached rows
        // written by earlier steps; the newest row's lines, prefetched before its writer ends,
        // are updated in L2 by it (prefetch.L2 leaves L1 alone; the loads come after the wait).
        if (pf & 1)
            for (int p = p_begin + threadIdx.x; p < p_end; p += blockDim.x) {
                const u64 off = ((u64)table[p / bs] * bs + p % bs) * row + (u64)kvh * HD;
                if ((p - p_begin) % NDS == ds)
                    for (int d = 0; d < HD; d += 64) asm volatile("prefetch.global.L2 [%0];" ::"l"((const u16*)K + off + d));
                asm volatile("prefetch.global.L2 [%0];" ::"l"((const u16*)V + off + 8 * n_lo));
            }
        GDC();
    }
    // this thread's rows: token g of heads hA (row g) and hB (row g + 8)
    const int hA = kvh * grp + 2 * warp, hB = hA + 1;
    const bool vA = g < (int)nq && 2 * warp < grp, vB = g < (int)nq && 2 * warp + 1 < grp;
    const int ptok = g < (int)nq ? (int)pos[t0 + g] : -1;
    const int pqA = vA ? ptok : -1, pqB = vB ? ptok : -1;
    const int lqA = window > 0 ? max(0, pqA + 1 - window) : 0, lqB = window > 0 ? max(0, pqB + 1 - window) : 0;
    // q as A fragments: a0 (row g, dims 2t..), a1 (row g+8), a2 (row g, dims 8+2t..), a3 (row g+8)
    u32 qa[HD / 16][4];
    {
        const float* qA = q + ((u64)(t0 + g) * n_head + hA) * HD;
        const float* qB = q + ((u64)(t0 + g) * n_head + hB) * HD;
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++) {
            const int d = ks * 16 + 2 * t;
            float2 x0 = vA ? *(const float2*)(qA + d) : make_float2(0.f, 0.f);
            float2 x1 = vB ? *(const float2*)(qB + d) : make_float2(0.f, 0.f);
            float2 x2 = vA ? *(const float2*)(qA + d + 8) : make_float2(0.f, 0.f);
            float2 x3 = vB ? *(const float2*)(qB + d + 8) : make_float2(0.f, 0.f);
            qa[ks][0] = am_pack(x0.x, x0.y);
            qa[ks][1] = am_pack(x1.x, x1.y);
            qa[ks][2] = am_pack(x2.x, x2.y);
            qa[ks][3] = am_pack(x3.x, x3.y);
        }
    }
    float o[NPT][4];  // n8 tile n_lo + n of the output
#pragma unroll
    for (int n = 0; n < NPT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float mA = -INF, mB = -INF, lA = 0.f, lB = 0.f;  // l: this thread's share of the row sums
    // K: 16-byte pieces, a row's pieces on consecutive threads; V: a piece per thread, the
    // positions on consecutive threads (so the transposed stores fall in distinct words).
    // AM_LD pieces of each per thread in flight before the stores (a block of few warps, a
    // decode step's, would otherwise wait out one load latency per piece)
    constexpr int LD = HD >= 256 ? 2 : AM_LD;
    // the pieces i0 + j · blockDim of the chunk at `base` into registers
    auto fetch = [&](int base, int i0, uint4 (&kv)[LD], uint4 (&vv)[LD]) {
#pragma unroll
        for (int j = 0; j < LD; j++) {
            const int i = i0 + j * blockDim.x;
            const int p = base + i / (HD / 8), pv = base + i % AM_KB, cv = i / AM_KB - n_lo;
            kv[j] = vv[j] = make_uint4(0, 0, 0, 0);
            if (i < AM_KB * HD / 8 && p < p_end) kv[j] = ((const uint4*)(K + 2 * (((u64)table[p / bs] * bs + p % bs) * row + (u64)kvh * HD)))[i % (HD / 8)];
            if (i < AM_KB * HD / 8 && pv < p_end && (NDS == 1 || (cv >= 0 && cv < NPT)))
                vv[j] = ((const uint4*)(V + 2 * (((u64)table[pv / bs] * bs + pv % bs) * row + (u64)kvh * HD)))[i / AM_KB];
        }
    };
    // and from registers into Ks / Vt
    auto stage = [&](int i0, const uint4 (&kv)[LD], const uint4 (&vv)[LD]) {
#pragma unroll
        for (int j = 0; j < LD; j++) {
            const int i = i0 + j * blockDim.x;
            if (i >= AM_KB * HD / 8) break;
            *(uint4*)&Ks[i / (HD / 8)][8 * (i % (HD / 8))] = kv[j];
            const int rv = i % AM_KB, cv = i / AM_KB;
            const u32 w[4] = {vv[j].x, vv[j].y, vv[j].z, vv[j].w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                Vt[8 * cv + 2 * k][rv] = (u16)(w[k] & 0xffff);
                Vt[8 * cv + 2 * k + 1][rv] = (u16)(w[k] >> 16);
            }
        }
    };
    // decode steps (pf & 2) whose chunk is one round of pieces: the next chunk's pieces load
    // while this chunk is computed (the same values staged: the same bits)
    const bool pipe = NDS > 1 && (pf & 2) && AM_KB * HD / 8 <= LD * (int)blockDim.x;
    uint4 nk[LD], nv[LD];
    if (pipe && p_begin < p_end) fetch(p_begin, threadIdx.x, nk, nv);
    for (int base = p_begin; base < p_end; base += AM_KB) {
        __syncthreads();
        if (pipe) {
            stage(threadIdx.x, nk, nv);
        } else {
            for (int i0 = threadIdx.x; i0 < AM_KB * HD / 8; i0 += LD * blockDim.x) {
                uint4 kv[LD], vv[LD];
                fetch(base, i0, kv, vv);
                stage(i0, kv, vv);
            }
        }
        __syncthreads();
        if (pipe && base + AM_KB < p_end) fetch(base + AM_KB, threadIdx.x, nk, nv);
        // S = q·K^T: 4 n8 tiles of positions; s[j]: (row g, pos 8j+2t, +1), (row g+8, same)
        float s[AM_KB / 8][4];
#pragma unroll
        for (int j = 0; j < AM_KB / 8; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
            for (int ks = 0; ks < HD / 16; ks++) {
                const u32 b0 = *(const u32*)&Ks[8 * j + g][ks * 16 + 2 * t];
                const u32 b1 = *(const u32*)&Ks[8 * j + g][ks * 16 + 8 + 2 * t];
                mma_f16_k16(s[j], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], b0, b1);
            }
        }
        float xA = -INF, xB = -INF;
#pragma unroll
        for (int j = 0; j < AM_KB / 8; j++) {
            const int p = base + 8 * j + 2 * t;
            s[j][0] = am_logit(s[j][0], p, pqA, lqA, scale, softcap);
            s[j][1] = am_logit(s[j][1], p + 1, pqA, lqA, scale, softcap);
            s[j][2] = am_logit(s[j][2], p, pqB, lqB, scale, softcap);
            s[j][3] = am_logit(s[j][3], p + 1, pqB, lqB, scale, softcap);
            xA = fmaxf(xA, fmaxf(s[j][0], s[j][1]));
            xB = fmaxf(xB, fmaxf(s[j][2], s[j][3]));
        }
        const float nA = fmaxf(mA, am_max4(xA)), nB = fmaxf(mB, am_max4(xB));
        // a row with nothing unmasked yet keeps m = -INF, its probabilities 0
        const float cA = nA == -INF ? 1.f : expf(mA - nA), cB = nB == -INF ? 1.f : expf(mB - nB);
        float sA = 0.f, sB = 0.f;
#pragma unroll
        for (int j = 0; j < AM_KB / 8; j++) {
            s[j][0] = nA == -INF ? 0.f : expf(s[j][0] - nA);
            s[j][1] = nA == -INF ? 0.f : expf(s[j][1] - nA);
            s[j][2] = nB == -INF ? 0.f : expf(s[j][2] - nB);
            s[j][3] = nB == -INF ? 0.f : expf(s[j][3] - nB);
            sA += s[j][0] + s[j][1];
            sB += s[j][2] + s[j][3];
        }
        lA = lA * cA + sA;
        lB = lB * cB + sB;
        mA = nA;
        mB = nB;
#pragma unroll
        for (int n = 0; n < NPT; n++) {
            o[n][0] *= cA;
            o[n][1] *= cA;
            o[n][2] *= cB;
            o[n][3] *= cB;
        }
        // O += P·V: P's C fragments are the A fragments of 16-position steps
#pragma unroll
        for (int kk = 0; kk < AM_KB / 16; kk++) {
            const u32 a0 = am_pack(s[2 * kk][0], s[2 * kk][1]), a1 = am_pack(s[2 * kk][2], s[2 * kk][3]);
            const u32 a2 = am_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]), a3 = am_pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int n = 0; n < NPT; n++) {
                const u32 b0 = *(const u32*)&Vt[8 * (n_lo + n) + g][kk * 16 + 2 * t];
                const u32 b1 = *(const u32*)&Vt[8 * (n_lo + n) + g][kk * 16 + 8 + 2 * t];
                mma_f16_k16(o[n], a0, a1, a2, a3, b0, b1);
            }
        }
    }
    lA = am_sum4(lA);
    lB = am_sum4(lB);
    if (out) {
        // one span (the batch's positions all below `span`): the rows normalized here with
        // attn_combine's arithmetic for one split (weight exp(0) = 1: L = 0 + l, O = 0 + acc,
        // O · (1 / L)), the same bits without the partials and the combine's launch; Q8 copies
        // for the next matmul where asked (a warp per row through a staging row)
        __shared__ float stg[8][HD];
        for (int rr = 0; rr < 16; rr++) {
            const int tok = rr % 8, b = rr / 8;
            if (tok >= (int)nq || 2 * warp + b >= grp) continue;  // warp-uniform
            if (g == tok) {
                const float L = __fadd_rn(0.f, b ? lB : lA);
                const float inv = __fdiv_rn(1.f, L);
#pragma unroll
                for (int n = 0; n < NPT; n++) {
                    // the row's accumulators chosen by value, not by a runtime index (which
                    // would put o in local memory)
                    const float o0 = b ? o[n][2] : o[n][0], o1 = b ? o[n][3] : o[n][1];
                    stg[warp][8 * n + 2 * t] = L > 0.f ? __fmul_rn(__fadd_rn(0.f, o0), inv) : 0.f;
                    stg[warp][8 * n + 2 * t + 1] = L > 0.f ? __fmul_rn(__fadd_rn(0.f, o1), inv) : 0.f;
                }
            }
            __syncwarp();
            const u64 th = (u64)(t0 + tok) * n_head + (b ? hB : hA);
            // this block's dims [8 n_lo, 8 n_lo + 8 NPT): Q8 blocks of 32 (NPT % 4 == 0)
#pragma unroll
            for (int j = 0; j < NPT / 4; j++) {
                const float v = stg[warp][32 * j + lane];
                const int d = 8 * n_lo + 32 * j + lane;
                out[th * HD + d] = v;
                if (xq) q8_store(v, xq, xm, th * (HD / 32) + d / 32);
            }
            __syncwarp();
        }
        return;
    }
    // the partials of row g (head hA: o[n][0..1]) and row g + 8 (head hB: o[n][2..3])
    auto write_part = [&](int head, float m, float l, int c) {
        float* out = part + (((u64)(t0 + g - tok_base) * n_head + head) * n_split + split) * (HD + 2);
        if (t == 0 && ds == 0) {
            out[0] = m;
            out[1] = l;
        }
#pragma unroll
        for (int n = 0; n < NPT; n++) {
            out[2 + 8 * (n_lo + n) + 2 * t] = o[n][c];
            out[3 + 8 * (n_lo + n) + 2 * t] = o[n][c + 1];
        }
    };
    if (vA) write_part(hA, mA, lA, 0);
    if (vB) write_part(hB, mB, lB, 2);
}

// attn_mma_f16_<hd>: blockDim = 32 x ceil(group / 2) (at most 8 warps), grid (tiles, KV heads,
// splits); the parameters of attention.cu's ATTN_ARGS.
#define ATTN_MMA(HD)                                                                                                   \
    extern "C" __global__ void __launch_bounds__(256) attn_mma_f16_##HD(                                              \
        const float* q, const u8* K, const u8* V, float* part, const u32* tiles, const u32* pos, const u32* bt_off,   \
        const u32* bt, int n_head, int n_kv_head, int hd, int bs, float scale, float softcap, int window, int rot,    \
        int q16, const float* koff) {                                                                                \
        attn_mma<HD>(q, K, V, part, tiles, pos, bt_off, bt, n_head, n_kv_head, bs, scale, softcap, window, 0, 0,     \
                     nullptr, nullptr, nullptr);                                                                       \
    }
// attn_mmi_f16_<hd>: the batch-invariant flavour; grid (tiles from `tiles`, KV heads, spans),
// partials of tokens from tok_base on (the launch's first tile's first token), or with `out`
// (one span) the normalized rows and their Q8 copies (xq, xm; null: none) in place of them.
// attn_mmid_f16_<hd>: the same for decode steps (one query per tile) over HD / 32 blocks per KV
// head, each the P·V and output of 32 dims (grid (tiles, KV heads x HD / 32, spans)): the same
// bits, with four times the blocks and a quarter of the P·V, V staging and epilogue per block (a
// decode step's few blocks are latency-bound).
#define ATTN_MMI_AS(NAME, HD, NDS)                                                                                     \
    extern "C" __global__ void __launch_bounds__(256) NAME(                                                           \
        const float* q, const u8* K, const u8* V, float* part, const u32* tiles, const u32* pos, const u32* bt_off,   \
        const u32* bt, int n_head, int n_kv_head, int bs, float scale, float softcap, int window, int span,           \
        int tok_base, float* out, i8* xq, float2* xm, int pf) {                                                        \
        attn_mma<HD, NDS>(q, K, V, part, tiles, pos, bt_off, bt, n_head, n_kv_head, bs, scale, softcap, window, span,  \
                          tok_base, out, xq, xm, pf); /* GDC() inside */                                              \
    }
#define ATTN_MMI(HD) ATTN_MMI_AS(attn_mmi_f16_##HD, HD, 1)
#define ATTN_MMID(HD) ATTN_MMI_AS(attn_mmid_f16_##HD, HD, HD / 32)
ATTN_MMA(64)
ATTN_MMA(128)
ATTN_MMA(256)
ATTN_MMI(64)
ATTN_MMI(128)
ATTN_MMI(256)
ATTN_MMID(64)
ATTN_MMID(128)
ATTN_MMID(256)
