// Matrix kernels: activation quantization to Q8 (32-value blocks), quantized GEMV with dp4a
// (several rows per warp, 16-byte weight loads), float GEMV (F16/BF16/F32), dequantization to
// f16 for the cuBLAS prefill GEMM, and embedding gathers.

// x (n rows of n_in) -> xq int8 (same layout) and xm float2 {d, d * sum(q)} per 32 values,
// d and the sum rounded through f16 as ggml's block_q8_0 / block_q8_1 store them.
extern "C" __global__ void quantize_q8(const float* __restrict__ x, i8* __restrict__ xq, float2* __restrict__ xm, int n_blocks) {
    GDC();
    int b = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (b >= n_blocks) return;
    q8_store(x[(u64)b * 32 + threadIdx.x % 32], xq, xm, (u64)b);
}

#define GEMV_WARPS 4
// rows per warp and the unrolling of a lane's loop over its units (src/matmul/mod.rs mirrors
// GEMV_ROWS); scripts/gemv-bench.py compiles other values to compare them
#ifndef GEMV_ROWS
#define GEMV_ROWS 2
#endif
#ifndef GEMV_UNROLL
#define GEMV_UNROLL 2
#endif
// The same for a decode step's routed expert GEMVs (moe.cu): four units of each row in flight
// per lane, faster than two there (about 5% of Mixtral-8x7B's decode speed).
#define MOE_GEMV_UNROLL 4

// Bytes per unit of 32 values in the payload plane (P) and the meta plane (M) of quant type QT
// (src/weights/mod.rs: 16-byte nibble planes, K-quant super-blocks of 8 units, Q6_K padded to 224).
template <int QT>
__device__ __forceinline__ void unit_bytes(u32* pb, u32* mb) {
    if (QT == QT_Q4_0) { *pb = 16; *mb = 2; }
    else if (QT == QT_Q4_1) { *pb = 16; *mb = 4; }
    else if (QT == QT_Q5_0 || QT == QT_Q5_1) { *pb = 16; *mb = 8; }
    else if (QT == QT_Q8_0) { *pb = 32; *mb = 2; }
    else if (QT == QT_Q4_K) { *pb = 18; *mb = 0; }
    else if (QT == QT_Q5_K) { *pb = 22; *mb = 0; }
    else { *pb = 28; *mb = 0; }  // Q6_K
}

// Before waiting for the previous kernel (PDL, see GDC in common.cuh): prefetch this block's
// weight rows into L2. Weights never change during a step, so reading them early is safe, and
// the DRAM streams them while the small kernel before (RMSNorm, SwiGLU, attention combine) runs.
// One lane per row of each row group (the group's first warp) issues one bulk prefetch per plane.
template <int QT>
__device__ __forceinline__ void gemv_prefetch(const u8* P, const u8* M, int U, int n_out, int wpr, int blk) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (warp % wpr != 0 || lane >= GEMV_ROWS) return;
    const int row = (blk * (GEMV_WARPS / wpr) + warp / wpr) * GEMV_ROWS + lane;
    if (row >= n_out) return;
    u32 pb, mb;
    unit_bytes<QT>(&pb, &mb);
    prefetch_l2(P + (u64)row * U * pb, (u64)U * pb);
    if (mb > 0 && M) prefetch_l2(M + (u64)row * U * mb, (u64)U * mb);
}

// The epilogue of the q/k/v GEMV (gemv3r_*): RoPE of the rows of q and k (adjacent pairs,
// whole heads: a row group's rows are whole pairs since GEMV_ROWS is even) and the f16 KV-cache
// store of k and v, as the rope and kv_store kernels after it would do (the same arithmetic).
struct RopeEp {
    const u32* pos;  // position of token t
    const float* ff;  // frequency factors (null: none)
    float theta_scale, freq_scale;
    int hd;  // head size
    int rope;  // rotate these rows
    u16* cache;  // null: no cache store; else row (slots[t] * n_out + r)
    const u32* slots;
};

// Sum the warps' partial dot products of each row group and write the rows.
template <int NT, bool EP = false>
__device__ __forceinline__ void gemv_reduce(float (&acc)[GEMV_ROWS][NT], float (*red)[GEMV_ROWS * NT], float* __restrict__ out, int row0,
                                            int n_out, int wpr, const RopeEp ep = RopeEp{}) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = warp_sum(acc[r][t]);
            if (lane == 0) red[warp][r * NT + t] = v;
        }
    __syncthreads();
    if (EP && warp % wpr == 0) {
        // a lane per (token, pair of rows)
        for (int l = lane; l < GEMV_ROWS / 2 * NT; l += 32) {
            int r = 2 * (l / NT), t = l % NT;
            float s0 = 0.f, s1 = 0.f;
            for (int i = 0; i < wpr; i++) {
                s0 += red[warp + i][r * NT + t];
                s1 += red[warp + i][(r + 1) * NT + t];
            }
            const int row = row0 + r;
            if (row + 1 >= n_out) continue;
            float y0 = s0, y1 = s1;
            if (ep.rope) rope_rot(s0, s1, ep.pos[t], ep.ff, (row % ep.hd) / 2, ep.theta_scale, ep.freq_scale, &y0, &y1);
            out[(u64)t * n_out + row] = y0;
            out[(u64)t * n_out + row + 1] = y1;
            if (ep.cache) {
                u16* c = ep.cache + (u64)ep.slots[t] * n_out + row;
                *(u32*)c = (u32)f2h(y0) | ((u32)f2h(y1) << 16);
            }
        }
    } else if (warp % wpr == 0) {
        for (int l = lane; l < GEMV_ROWS * NT; l += 32) {
            int r = l / NT, t = l % NT;
            float s = 0.f;
            for (int i = 0; i < wpr; i++) s += red[warp + i][l];
            if (row0 + r < n_out) out[(u64)t * n_out + row0 + r] = s;
        }
    }
}

// out[t * n_out + row] = sum_k W[row] . x[t], t < NT; x given as Q8 units (xq, xm), U units per row.
// A block's 4 warps cover 4 / wpr groups of GEMV_ROWS rows; the wpr warps of a group split the
// row's units (wpr > 1 for matrices with few rows, so that the grid fills the GPU).
template <int QT, int NT, bool EP = false, int UNR = GEMV_UNROLL>
__device__ __forceinline__ void gemv_q(const u8* __restrict__ P, const u8* __restrict__ M, const i8* __restrict__ xq,
                                       const float2* __restrict__ xm, float* __restrict__ out, int U, int n_out, int wpr, int blk,
                                       const RopeEp ep = RopeEp{}) {
    __shared__ float red[GEMV_WARPS][GEMV_ROWS * NT];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = warp / wpr, sub = warp % wpr;
    const int row0 = (blk * (GEMV_WARPS / wpr) + group) * GEMV_ROWS;
    float acc[GEMV_ROWS][NT];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.f;
    if (row0 < n_out) {
#pragma unroll UNR
        for (int k = lane + 32 * sub; k < U; k += 32 * wpr) {
            int4 xa[NT], xb[NT];
            float2 xs[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const int4* xp = (const int4*)(xq + ((u64)t * U + k) * 32);
                xa[t] = xp[0];
                xb[t] = xp[1];
                xs[t] = xm[(u64)t * U + k];
            }
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; r++) {
                // rows past the end re-read the last row (results dropped)
                int row = min(row0 + r, n_out - 1);
                Unit u = load_unit<QT>(P, M, (u64)row, k, U);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    int s0 = dp4a(u.q[3], xa[t].w, dp4a(u.q[2], xa[t].z, dp4a(u.q[1], xa[t].y, dp4a(u.q[0], xa[t].x, 0))));
                    int s1 = dp4a(u.q[7], xb[t].w, dp4a(u.q[6], xb[t].z, dp4a(u.q[5], xb[t].y, dp4a(u.q[4], xb[t].x, 0))));
                    if (QT == QT_Q6_K) {
                        acc[r][t] += xs[t].x * (u.s0 * (float)s0 + u.s1 * (float)s1);
                    } else {
                        acc[r][t] += (float)(s0 + s1) * (u.s0 * xs[t].x) + u.o * xs[t].y;
                    }
                }
            }
        }
    }
    gemv_reduce<NT, EP>(acc, red, out, row0, n_out, wpr, ep);
}

#define WT_F32 0
#define WT_F16 1
#define WT_BF16 2

// Eight consecutive weights of a float row as f32.
template <int WT>
__device__ __forceinline__ void load8(const u8* __restrict__ W, u64 e, float* w) {
    if (WT == WT_F32) {
        const float4* p = (const float4*)(W + e * 4);
        float4 a = p[0], b = p[1];
        w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w; w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
    } else {
        uint4 v = *(const uint4*)(W + e * 2);
        u32 a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            u16 lo = (u16)(a[i] & 0xffff), hi = (u16)(a[i] >> 16);
            w[2 * i] = WT == WT_F16 ? h2f(lo) : bf2f(lo);
            w[2 * i + 1] = WT == WT_F16 ? h2f(hi) : bf2f(hi);
        }
    }
}

// Float weights, f32 activations; n_in a multiple of 8. Row groups and warps as in gemv_q.
template <int WT, int NT>
__device__ __forceinline__ void gemv_f(const u8* __restrict__ W, const float* __restrict__ x, float* __restrict__ out, int n_in, int n_out, int wpr) {
    // blockIdx.y: the chunk of NT tokens (prefills of small matrices: src/matmul/mod.rs gemv_float_tiled)
    x += (u64)blockIdx.y * NT * n_in;
    out += (u64)blockIdx.y * NT * n_out;
    __shared__ float red[GEMV_WARPS][GEMV_ROWS * NT];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = warp / wpr, sub = warp % wpr;
    const int row0 = (blockIdx.x * (GEMV_WARPS / wpr) + group) * GEMV_ROWS;
    // as gemv_prefetch: the rows into L2 before waiting for the previous kernel
    const u64 row_bytes = (u64)n_in * (WT == WT_F32 ? 4 : 2);
    if (sub == 0 && lane < GEMV_ROWS && row0 + lane < n_out) prefetch_l2(W + (u64)(row0 + lane) * row_bytes, row_bytes);
    GDC();
    float acc[GEMV_ROWS][NT];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.f;
    const int C = n_in / 8;
    if (row0 < n_out) {
#pragma unroll 2
        for (int c = lane + 32 * sub; c < C; c += 32 * wpr) {
            float xv[NT][8];
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float4* xp = (const float4*)(x + (u64)t * n_in + c * 8);
                float4 a = xp[0], b = xp[1];
                xv[t][0] = a.x; xv[t][1] = a.y; xv[t][2] = a.z; xv[t][3] = a.w;
                xv[t][4] = b.x; xv[t][5] = b.y; xv[t][6] = b.z; xv[t][7] = b.w;
            }
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; r++) {
                int row = min(row0 + r, n_out - 1);
                float w[8];
                load8<WT>(W, (u64)row * n_in + c * 8, w);
#pragma unroll
                for (int t = 0; t < NT; t++)
#pragma unroll
                    for (int i = 0; i < 8; i++) acc[r][t] += w[i] * xv[t][i];
            }
        }
    }
    gemv_reduce<NT>(acc, red, out, row0, n_out, wpr);
}

// gemv3_*: up to three matrices of the same type and input (q/k/v, gate/up) in one launch;
// blocks [0, nb0) compute matrix 0, [nb0, nb0 + nb1) matrix 1, the rest matrix 2, each with its
// own warps per row (wpr0..2: what its own gemv_* launch takes, so that its rows get the same
// bits joined or alone: a prefill's chunks are never joined, a decode step's are).
#define GEMV_Q(NAME, QT, NT)                                                                                     \
    extern "C" __global__ void __launch_bounds__(128) gemv_##NAME##_##NT(const u8* P, const u8* M, const i8* xq, \
                                                                         const float2* xm, float* out, int U, int n_out, int wpr) { \
        gemv_prefetch<QT>(P, M, U, n_out, wpr, blockIdx.x);                                                      \
        GDC();                                                                                                   \
        const u64 c = blockIdx.y; /* the chunk of NT tokens (prefills: one launch for all chunks) */          \
        gemv_q<QT, NT>(P, M, xq + c * NT * U * 32, xm + c * NT * U, out + c * NT * n_out, U, n_out, wpr, blockIdx.x); \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(128) gemv3_##NAME##_##NT(                                       \
        const u8* P0, const u8* M0, float* o0, int n0, int nb0, const u8* P1, const u8* M1, float* o1, int n1, int nb1, \
        const u8* P2, const u8* M2, float* o2, int n2, const i8* xq, const float2* xm, int U, int wpr0, int wpr1,  \
        int wpr2) {                                                                                              \
        int b = blockIdx.x;                                                                                      \
        if (b < nb0) gemv_prefetch<QT>(P0, M0, U, n0, wpr0, b);                                                  \
        else if (b < nb0 + nb1) gemv_prefetch<QT>(P1, M1, U, n1, wpr1, b - nb0);                                 \
        else gemv_prefetch<QT>(P2, M2, U, n2, wpr2, b - nb0 - nb1);                                              \
        GDC();                                                                                                   \
        if (b < nb0) gemv_q<QT, NT>(P0, M0, xq, xm, o0, U, n0, wpr0, b);                                         \
        else if (b < nb0 + nb1) gemv_q<QT, NT>(P1, M1, xq, xm, o1, U, n1, wpr1, b - nb0);                         \
        else gemv_q<QT, NT>(P2, M2, xq, xm, o2, U, n2, wpr2, b - nb0 - nb1);                                     \
    }

// gemv3r_*: gemv3_* over q, k, v with RoPE and the KV-cache store in the epilogue (RopeEp):
// q rotated; k rotated when rope_k, stored to kd when set; v stored to vd when set (f16 caches,
// rows of n1 = n2 values per slot). GEMV_ROWS even (whole rope pairs per row group).
#if GEMV_ROWS % 2 == 0
#define GEMV3R_Q(NAME, QT, NT)                                                                                   \
    extern "C" __global__ void __launch_bounds__(128) gemv3r_##NAME##_##NT(                                      \
        const u8* P0, const u8* M0, float* o0, int n0, int nb0, const u8* P1, const u8* M1, float* o1, int n1, int nb1, \
        const u8* P2, const u8* M2, float* o2, int n2, const i8* xq, const float2* xm, int U, int wpr0, int wpr1,  \
        int wpr2, const u32* pos, const float* ff, float theta_scale, float freq_scale, int hd, int rope_k, u16* kd, \
        u16* vd, const u32* slots) {                                                                             \
        int b = blockIdx.x;                                                                                      \
        if (b < nb0) gemv_prefetch<QT>(P0, M0, U, n0, wpr0, b);                                                  \
        else if (b < nb0 + nb1) gemv_prefetch<QT>(P1, M1, U, n1, wpr1, b - nb0);                                 \
        else gemv_prefetch<QT>(P2, M2, U, n2, wpr2, b - nb0 - nb1);                                              \
        GDC();                                                                                                   \
        RopeEp ep{pos, ff, theta_scale, freq_scale, hd, 1, nullptr, slots};                                      \
        if (b < nb0) {                                                                                           \
            gemv_q<QT, NT, true>(P0, M0, xq, xm, o0, U, n0, wpr0, b, ep);                                              \
        } else if (b < nb0 + nb1) {                                                                              \
            ep.rope = rope_k;                                                                                    \
            ep.cache = kd;                                                                                       \
            gemv_q<QT, NT, true>(P1, M1, xq, xm, o1, U, n1, wpr1, b - nb0, ep);                                        \
        } else {                                                                                                 \
            ep.rope = 0;                                                                                         \
            ep.cache = vd;                                                                                       \
            gemv_q<QT, NT, true>(P2, M2, xq, xm, o2, U, n2, wpr2, b - nb0 - nb1, ep);                                  \
        }                                                                                                        \
    }
#else
#define GEMV3R_Q(NAME, QT, NT)
#endif

#define GEMV_Q_ALL(NAME, QT) GEMV_Q(NAME, QT, 1) GEMV_Q(NAME, QT, 2) GEMV_Q(NAME, QT, 4) GEMV_Q(NAME, QT, 8) \
    GEMV3R_Q(NAME, QT, 1) GEMV3R_Q(NAME, QT, 2) GEMV3R_Q(NAME, QT, 4) GEMV3R_Q(NAME, QT, 8)
GEMV_Q_ALL(q4_0, QT_Q4_0)
GEMV_Q_ALL(q4_1, QT_Q4_1)
GEMV_Q_ALL(q5_0, QT_Q5_0)
GEMV_Q_ALL(q5_1, QT_Q5_1)
GEMV_Q_ALL(q8_0, QT_Q8_0)
GEMV_Q_ALL(q4_K, QT_Q4_K)
GEMV_Q_ALL(q5_K, QT_Q5_K)
GEMV_Q_ALL(q6_K, QT_Q6_K)

#define GEMV_F(NAME, WT, NT)                                                                                          \
    extern "C" __global__ void __launch_bounds__(128) gemv_##NAME##_##NT(const u8* W, const float* x, float* out, int n_in, \
                                                                         int n_out, int wpr) {                       \
        gemv_f<WT, NT>(W, x, out, n_in, n_out, wpr);                                                                  \
    }
#define GEMV_F_ALL(NAME, WT) GEMV_F(NAME, WT, 1) GEMV_F(NAME, WT, 2) GEMV_F(NAME, WT, 4) GEMV_F(NAME, WT, 8)
GEMV_F_ALL(f32, WT_F32)
GEMV_F_ALL(f16, WT_F16)
GEMV_F_ALL(bf16, WT_BF16)

// Quantized weight -> f16 matrix (row-major, n_in per row), one thread per unit of 32.
template <int QT>
__device__ __forceinline__ void dequant_f16(const u8* __restrict__ P, const u8* __restrict__ M, u16* __restrict__ out, int U, u64 n_units) {
    GDC();
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n_units) return;
    u64 row = g / U;
    int k = (int)(g % U);
    Unit u = load_unit<QT>(P, M, row, k, U);
    u32 h[16];
#pragma unroll
    for (int i = 0; i < 16; i++) h[i] = (u32)f2h(unit_value(u, 2 * i)) | ((u32)f2h(unit_value(u, 2 * i + 1)) << 16);
    uint4* o = (uint4*)(out + g * 32);
#pragma unroll
    for (int i = 0; i < 4; i++) o[i] = make_uint4(h[4 * i], h[4 * i + 1], h[4 * i + 2], h[4 * i + 3]);
}

// Quantized embedding rows -> f32, one thread per (token, unit).
template <int QT>
__device__ __forceinline__ void embed_q(const u8* __restrict__ P, const u8* __restrict__ M, const u32* __restrict__ tok,
                                        float* __restrict__ out, int U, int n_tok) {
    GDC();
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (u64)n_tok * U) return;
    int t = (int)(g / U), k = (int)(g % U);
    Unit u = load_unit<QT>(P, M, (u64)tok[t], k, U);
    float* o = out + g * 32;
#pragma unroll
    for (int i = 0; i < 32; i++) o[i] = unit_value(u, i);
}

#define QUNIT_KERNELS(NAME, QT)                                                                                  \
    extern "C" __global__ void dequant_##NAME(const u8* P, const u8* M, u16* out, int U, u64 n_units) {          \
        dequant_f16<QT>(P, M, out, U, n_units);                                                                  \
    }                                                                                                            \
    extern "C" __global__ void embed_##NAME(const u8* P, const u8* M, const u32* tok, float* out, int U, int n_tok) { \
        embed_q<QT>(P, M, tok, out, U, n_tok);                                                                   \
    }
QUNIT_KERNELS(q4_0, QT_Q4_0)
QUNIT_KERNELS(q4_1, QT_Q4_1)
QUNIT_KERNELS(q5_0, QT_Q5_0)
QUNIT_KERNELS(q5_1, QT_Q5_1)
QUNIT_KERNELS(q8_0, QT_Q8_0)
QUNIT_KERNELS(q4_K, QT_Q4_K)
QUNIT_KERNELS(q5_K, QT_Q5_K)
QUNIT_KERNELS(q6_K, QT_Q6_K)

template <int WT>
__device__ __forceinline__ float fval(const u8* W, u64 e) {
    if (WT == WT_F32) return ((const float*)W)[e];
    u16 h = ((const u16*)W)[e];
    return WT == WT_F16 ? h2f(h) : bf2f(h);
}

#define FLOAT_KERNELS(NAME, WT)                                                                                 \
    extern "C" __global__ void embed_##NAME(const u8* W, const u32* tok, float* out, int n_in, int n_tok) {      \
        GDC();                                                                                                   \
        u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;                                                      \
        if (g >= (u64)n_tok * n_in) return;                                                                      \
        u64 t = g / n_in, i = g % n_in;                                                                          \
        out[g] = fval<WT>(W, (u64)tok[t] * n_in + i);                                                            \
    }                                                                                                            \
    extern "C" __global__ void tof16_##NAME(const u8* W, u16* out, u64 n) {                                      \
        GDC();                                                                                                   \
        u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;                                                      \
        if (g < n) out[g] = f2h(fval<WT>(W, g));                                                                 \
    }
FLOAT_KERNELS(f32, WT_F32)
FLOAT_KERNELS(f16, WT_F16)
FLOAT_KERNELS(bf16, WT_BF16)
