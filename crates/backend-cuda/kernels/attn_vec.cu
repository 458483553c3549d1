// Paged causal attention over an f16 cache in llama.cpp's CPU numerics (ggml's "vector" flash
// attention, which the CPU backend reproduces for sequences of fewer than 64 query tokens),
// one block per (query token, head), one pass over the positions, no combine launch.
//
// ggml's order constrains only the sequential chain per head: the running maximum M, the sum
// S and the f16 V accumulator (per dim), updated position after position:
//     s > M: ms = exp(M - s), M = s, acc = f16(acc * ms), w = 1;  else ms = 1, w = exp(s - M)
//     acc = f16(fma(v, w, acc));  S = fma(S, ms, w)
// The rest runs in parallel, a chunk of positions at a time:
//   1. scores: the chunk's K and V rows are prefetched into L2, then 8 lanes per position
//      compute its q·k dot (q rounded to f16) in `ggml_vec_dot_f16`'s AVX-512 order (64
//      accumulators over 64-value steps, folded as ggml folds; `av_scores8`), K rows read with
//      16-byte loads;
//   2. the (ms, w) of every position: the maximum a position sees is an exclusive prefix max
//      over the chunk (a block scan), so each exp is computed once, in parallel, correctly
//      rounded (through f64, as glibc's expf nearly always is);
//   3. the chain: thread d owns dim d of the accumulator and applies the updates in position
//      order, AV_G positions at a time: their V values (coalesced) are loaded into registers a
//      group ahead, and a group without a new maximum (flagged in step 2: the usual case)
//      runs straight-line, one FMA and the f16 rounding per position. The chunk is padded to
//      whole pairs of groups with no-op positions (w = 0, ms = 1: f16(fma(v, 0, acc)) = acc).
// The output (acc / S, times the reciprocal as the CPU does) is written in f32 and, where the
// caller passes xq / xm, as Q8 blocks for the O projection.

#define AV_CH 1024  // positions per chunk (shared memory: 3 words per position), a multiple of 2 AV_G
#define AV_G 16     // positions per group of the chain

// x rounded to the nearest f16 value (ties to even), as f32: the two conversions are cheaper
// than the same rounding in integer and f32 arithmetic.
__device__ __forceinline__ float av_r16(float x) { return h2f(f2h(x)); }

// The scores of a chunk's n positions (W[j] = the scaled, soft-capped q·k of position j), 8
// lanes per position and AV_U positions per group of lanes in flight, in the order of
// `ggml_vec_dot_f16` (attention.cu's dot_ggml: 64 accumulators over 64-value steps): lane L
// of a group holds accumulators 8L..8L+7 of the 64 (k values read with one 16-byte load per
// 64-value step, coalesced: 8 lanes read 128 contiguous bytes), then the fold of dot_ggml across
// the lanes by shuffles — x[l] = (a[l] + a[32 + l]) + (a[16 + l] + a[48 + l]) is lane L's
// value plus lane L ^ 4's (lanes 0..3), plus lane L ^ 2's (lanes 0, 1), then x[l] + x[l + 8] is
// lane 0's plus lane 1's — and lane 0 ends the sum (x[l] + x[l + 4], the pairs, the tail of hd
// % 64 values in f64) exactly as dot_ggml does. Every lane of a warp runs the same iterations
// (shuffles need them all); blockDim a multiple of 32, hd <= 256, hd % 8 == 0.
#define AV_U 2
__device__ __forceinline__ void av_scores8(const float* __restrict__ Qs, const u16* __restrict__ Kh, const u32* __restrict__ SLOT, float* __restrict__ W,
                                           int n, int hd, float scale, float softcap) {
    const int L = threadIdx.x % 8, grp = threadIdx.x / 8, G = blockDim.x / 8;
    const int steps = hd / 64;  // 0..4
    float qr[4][8];
#pragma unroll
    for (int s = 0; s < 4; s++)
#pragma unroll
        for (int e = 0; e < 8; e++) qr[s][e] = s < steps ? Qs[64 * s + 8 * L + e] : 0.f;
    for (int jb = 0; jb < n; jb += AV_U * G) {
        uint4 kv[AV_U][4];
        int jj[AV_U];
#pragma unroll
        for (int u = 0; u < AV_U; u++) {
            jj[u] = jb + u * G + grp;
            const u16* kr = Kh + SLOT[min(jj[u], n - 1)] + 8 * L;
#pragma unroll
            for (int s = 0; s < 4; s++)
                if (s < steps) kv[u][s] = *(const uint4*)(kr + 64 * s);
        }
#pragma unroll
        for (int u = 0; u < AV_U; u++) {
            float a[8];
#pragma unroll
            for (int e = 0; e < 8; e++) a[e] = 0.f;
#pragma unroll
            for (int s = 0; s < 4; s++) {
                if (s < steps) {
                    const u32 w[4] = {kv[u][s].x, kv[u][s].y, kv[u][s].z, kv[u][s].w};
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        a[2 * e] = __fmaf_rn(qr[s][2 * e], h2f((u16)(w[e] & 0xffff)), a[2 * e]);
                        a[2 * e + 1] = __fmaf_rn(qr[s][2 * e + 1], h2f((u16)(w[e] >> 16)), a[2 * e + 1]);
                    }
                }
            }
#pragma unroll
            for (int e = 0; e < 8; e++) a[e] = __fadd_rn(a[e], __shfl_xor_sync(0xffffffffu, a[e], 4));
#pragma unroll
            for (int e = 0; e < 8; e++) a[e] = __fadd_rn(a[e], __shfl_xor_sync(0xffffffffu, a[e], 2));
#pragma unroll
            for (int e = 0; e < 8; e++) a[e] = __fadd_rn(a[e], __shfl_xor_sync(0xffffffffu, a[e], 1));
            const int j = jj[u];
            if (L == 0 && j < n) {
#pragma unroll
                for (int e = 0; e < 4; e++) a[e] = __fadd_rn(a[e], a[e + 4]);
                double sum = (double)__fadd_rn(__fadd_rn(a[0], a[2]), __fadd_rn(a[1], a[3]));
                const u16* k = Kh + SLOT[j];
                for (int i = 64 * steps; i < hd; i++) sum += (double)__fmul_rn(Qs[i], h2f(k[i]));
                float sc = __fmul_rn((float)sum, scale);
                if (softcap > 0.f) sc = __fmul_rn(softcap, tanhf(__fdiv_rn(sc, softcap)));
                W[j] = sc;
            }
        }
    }
}

// grid (tiles, n_head, query tokens per tile), blockDim a multiple of 32, >= hd and >= 64,
// <= 256; hd % 8 == 0, hd <= blockDim. meta as attention.cu: tiles (t0, nq, seq), pos, bt_off, bt.
// Dynamic shared memory: 4 * (hd + 3 * AV_CH + AV_CH / AV_G + 32) bytes.
__device__ __forceinline__ void attn_vec_body(const float* __restrict__ q, const u8* __restrict__ K, const u8* __restrict__ V, float* __restrict__ out,
                                              const u32* __restrict__ tiles, const u32* __restrict__ pos, const u32* __restrict__ bt_off,
                                              const u32* __restrict__ bt, int n_head, int n_kv_head, int hd, int bs, float scale, float softcap,
                                              int window, i8* __restrict__ xq, float2* __restrict__ xm) {
    // the batch arrays (written by copies before the previous kernel started) are read and the
    // first chunk's K / V rows prefetched into L2 before waiting for the previous kernel (which
    // writes q and this step's K / V rows: read only after the wait; an L2 prefetch of a row it
    // writes is harmless, L2 being coherent), overlapping its tail
    extern __shared__ float sm[];
    const int tid = threadIdx.x, T = blockDim.x, lane = tid % 32, warp = tid / 32, n_warps = T / 32;
    const u32 tile = blockIdx.x, h = blockIdx.y, qi = blockIdx.z;
    if (qi >= tiles[3 * tile + 1]) return;
    const u32 t = tiles[3 * tile] + qi, seq = tiles[3 * tile + 2];
    const int kvh = (int)h / (n_head / n_kv_head);
    const int pq = (int)pos[t];
    const int lo = window > 0 ? max(0, pq + 1 - window) : 0;
    float* Qs = sm;                       // [hd] q rounded to f16
    float* W = Qs + hd;                   // [AV_CH] scores, then w
    float* MS = W + AV_CH;                // [AV_CH] ms
    u32* SLOT = (u32*)(MS + AV_CH);       // [AV_CH] element offset of each position's K / V row (< 2^32: the host checks)
    u32* NEWG = SLOT + AV_CH;             // [AV_CH / AV_G] group has a new maximum
    float* RED = (float*)(NEWG + AV_CH / AV_G);  // [32] per-warp maxima
    {
        // the host's shared memory must hold this layout (src/attention/mod.rs attn_vec_smem)
        u32 dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < 4u * (u32)(hd + 3 * AV_CH + AV_CH / AV_G + 32)) __trap();
    }
    const u64 th = (u64)t * n_head + h;
    const u32 row = (u32)(n_kv_head * hd);
    const u16* Kh = (const u16*)K + (u64)kvh * hd;
    const u16* Vh = (const u16*)V + (u64)kvh * hd;
    const u32* table = bt + bt_off[seq];
    const bool act = tid < hd;
    const int col = act ? tid : 0;
    const u16* Vc = Vh + col;  // this thread's column of V
    float M = -INF, S = 0.f, acc = 0.f;
    for (int base = lo; base <= pq; base += AV_CH) {
        const int n = min(AV_CH, pq + 1 - base);
        const int n_pad = (n + 2 * AV_G - 1) / (2 * AV_G) * (2 * AV_G);
        // 1. this chunk's K and V rows on their way to L2, then the scores
        for (int j = tid; j < n_pad; j += T) {
            const int p = base + min(j, n - 1);
            const u32 off = (table[p / bs] * (u32)bs + (u32)(p % bs)) * row;
            SLOT[j] = off;
            if (j < n) {
                const u16* kr = Kh + off;
                const u16* vr = Vh + off;
                for (int o = 0; o < hd; o += 64) {
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(kr + o));
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(vr + o));
                }
            }
        }
        if (base == lo) {
            GDC();
            for (int d = tid; d < hd; d += T) Qs[d] = h2f(f2h(q[th * hd + d]));
        }
        for (int g = tid; g < n_pad / AV_G; g += T) NEWG[g] = 0;
        __syncthreads();
        av_scores8(Qs, Kh, SLOT, W, n, hd, scale, softcap);
        __syncthreads();
        // 2. the maximum each position sees: thread tid scans positions [tid * per, ..) of the chunk
        const int per = (n + T - 1) / T;
        const int j0 = min(n, tid * per), j1 = min(n, j0 + per);
        float mx = -INF;
        for (int j = j0; j < j1; j++) mx = fmaxf(mx, W[j]);
        float incl = mx;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            float y = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl = fmaxf(incl, y);
        }
        if (lane == 31) RED[warp] = incl;
        __syncthreads();
        float run = M;  // the maximum before this thread's first position
        for (int w = 0; w < warp; w++) run = fmaxf(run, RED[w]);
        float prev = __shfl_up_sync(0xffffffffu, incl, 1);
        if (lane > 0) run = fmaxf(run, prev);
        for (int j = j0; j < j1; j++) {
            const float sc = W[j];
            if (sc > run) {
                MS[j] = (float)exp((double)__fsub_rn(run, sc));
                W[j] = 1.f;
                NEWG[j / AV_G] = 1u;
                run = sc;
            } else {
                MS[j] = 1.f;
                W[j] = (float)exp((double)__fsub_rn(sc, run));
            }
        }
        for (int j = n + tid; j < n_pad; j += T) {
            MS[j] = 1.f;
            W[j] = 0.f;
        }
        for (int w = 0; w < n_warps; w++) M = fmaxf(M, RED[w]);
        __syncthreads();
        // 3. the chain, in position order, a group at a time (the next group's V in flight)
        // raw f16 bits, converted where used: a conversion (or a select) at the load would
        // wait for the load there. Threads past hd read column 0 (valid memory, unused).
        u32 va[AV_G], vb[AV_G];
#define AV_LOAD(VR, J0)                                                                 \
    _Pragma("unroll") for (int u = 0; u < AV_G; u++) VR[u] = Vc[SLOT[(J0) + u]];
// a group with a new maximum (rare): each position's rescale first, from the V values already
// in registers
#define AV_RUN(VR, J0)                                                                  \
    if (NEWG[(J0) / AV_G]) {                                                            \
        _Pragma("unroll") for (int u = 0; u < AV_G; u++) {                              \
            const float ms = MS[(J0) + u], w = W[(J0) + u];                             \
            if (ms != 1.f) acc = av_r16(__fmul_rn(acc, ms));                            \
            S = __fmaf_rn(S, ms, w);                                                    \
            acc = av_r16(__fmaf_rn(h2f((u16)VR[u]), w, acc));                           \
        }                                                                               \
    } else {                                                                            \
        _Pragma("unroll") for (int u = 0; u < AV_G; u++) {                              \
            const float w = W[(J0) + u];                                                \
            S = __fadd_rn(S, w);                                                        \
            acc = av_r16(__fmaf_rn(h2f((u16)VR[u]), w, acc));                                     \
        }                                                                               \
    }
        // warps wholly past hd have no dim to carry: they skip the chain
        if (warp * 32 < hd) {
            AV_LOAD(va, 0)
            for (int b = 0; b < n_pad; b += 2 * AV_G) {
                AV_LOAD(vb, b + AV_G)
                AV_RUN(va, b)
                if (b + 2 * AV_G < n_pad) {
                    AV_LOAD(va, b + 2 * AV_G)
                }
                AV_RUN(vb, b + AV_G)
            }
        }
#undef AV_LOAD
#undef AV_RUN
        __syncthreads();
    }
    // times the reciprocal, as the CPU backend normalizes
    const float o = S > 0.f ? __fmul_rn(acc, __fdiv_rn(1.f, S)) : 0.f;
    if (act) out[th * hd + tid] = o;
    // hd % 32 == 0 where xq is set: warps lie wholly inside or outside hd
    if (xq && tid < hd) q8_store(o, xq, xm, (th * hd + tid) / 32);
}

// The one-pass kernel (attn_vec_body).
extern "C" __global__ void __launch_bounds__(256) attn_vec2_f16(const float* __restrict__ q, const u8* __restrict__ K, const u8* __restrict__ V,
                                                                float* __restrict__ out, const u32* __restrict__ tiles, const u32* __restrict__ pos,
                                                                const u32* __restrict__ bt_off, const u32* __restrict__ bt, int n_head, int n_kv_head,
                                                                int hd, int bs, float scale, float softcap, int window, i8* __restrict__ xq,
                                                                float2* __restrict__ xm) {
    attn_vec_body(q, K, V, out, tiles, pos, bt_off, bt, n_head, n_kv_head, hd, bs, scale, softcap, window, xq, xm);
}
