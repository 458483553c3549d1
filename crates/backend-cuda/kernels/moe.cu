// Mixture-of-experts helpers: rows scattered back to route order after the grouped-by-expert
// matmul, the weighted combine of expert outputs per token, relu² (Nemotron-H), and the routed
// expert GEMV of decode steps.

// out[dst[j] * d + i] = y[j * d + i]
extern "C" __global__ void moe_scatter_rows(const float* __restrict__ y, const u32* __restrict__ dst, float* __restrict__ out, int d, int n) {
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (u64)n * d) return;
    u64 j = g / d, i = g % d;
    out[(u64)dst[j] * d + i] = y[g];
}

// out[t * d + i] += sum over the token's routes r (in route order) of w[r] * y[ridx[r] * d + i];
// a token's routes are ridx[off[t] .. off[t + 1]]. fresh: out holds zeros (not read).
extern "C" __global__ void moe_combine(const float* __restrict__ y, const u32* __restrict__ ridx, const float* __restrict__ w,
                                       const u32* __restrict__ off, float* __restrict__ out, int d, int n_tok, int fresh) {
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (u64)n_tok * d) return;
    u64 t = g / d, i = g % d;
    float a = fresh ? 0.f : out[g];
    for (u32 r = off[t]; r < off[t + 1]; r++) a = __fmaf_rn(y[(u64)ridx[r] * d + i], w[r], a);  // moe_combine_dev's sum
    out[g] = a;
}

// y (n / d rows of d) += bias[eids[row]] (per-expert biases of an expert matmul's rows).
extern "C" __global__ void moe_add_bias(float* __restrict__ y, const float* __restrict__ bias, const u32* __restrict__ eids, int d, u64 n) {
    GDC();
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n) return;
    y[g] = __fadd_rn(y[g], bias[(u64)eids[g / d] * d + g % d]);
}

// x = max(x, 0)²; xq/xm non-null (n a multiple of 32): the result also as Q8 (quantize_q8's
// arithmetic: the down matmul that follows needs no quantize launch).
__device__ __forceinline__ void relu_sqr_at(float* __restrict__ x, u64 n, i8* __restrict__ xq, float2* __restrict__ xm, u64 g) {
    if (g >= n) return;
    float v = fmaxf(x[g], 0.f);
    float o = __fmul_rn(v, v);
    x[g] = o;
    if (xq) q8_store(o, xq, xm, g / 32);
}

extern "C" __global__ void relu_sqr(float* __restrict__ x, u64 n, i8* __restrict__ xq, float2* __restrict__ xm) {
    GDC();
    relu_sqr_at(x, n, xq, xm, (u64)blockIdx.x * blockDim.x + threadIdx.x);
}

// relu_sqr of two buffers in one launch (an MoE layer's routed and shared expert activations):
// the first buffer's blocks, then the second's (blocks of 256 threads, n0 rounded up to them:
// a warp never spans both, so the Q8 blocks are relu_sqr's).
extern "C" __global__ void relu_sqr2(float* __restrict__ x0, u64 n0, i8* __restrict__ xq0, float2* __restrict__ xm0, float* __restrict__ x1,
                                     u64 n1, i8* __restrict__ xq1, float2* __restrict__ xm1) {
    GDC();
    const u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x, b0 = (n0 + 255) / 256 * 256;
    if (g < b0) relu_sqr_at(x0, n0, xq0, xm0, g);
    else relu_sqr_at(x1, n1, xq1, xm1, g - b0);
}

// Routed expert GEMV (decode, a few tokens): launch row j (blockIdx.y) computes
// out[dst[j] * n_out + row] = W_j[row] · x[src[j]] over the weight planes at wp[j] / wm[j] (the
// routed expert's rows: resident in the 3-D tensor, or its device slot when offloaded), with
// x given as Q8 units (xq, xm; U units per row). Every route of a layer in one launch, each
// computed exactly as the dense decode GEMV computes a row (matmul.cu's gemv_q).
#define MOE_GEMV(NAME, QT)                                                                                            \
    extern "C" __global__ void __launch_bounds__(128) moe_gemv_##NAME(const u64* __restrict__ wp, const u64* __restrict__ wm, \
        const u32* __restrict__ src, const u32* __restrict__ dst, const i8* __restrict__ xq, const float2* __restrict__ xm,   \
        float* __restrict__ out, int U, int n_out, int wpr) {                                                          \
        const int j = blockIdx.y;                                                                                      \
        const u64 s = src[j];                                                                                          \
        gemv_q<QT, 1>((const u8*)wp[j], (const u8*)wm[j], xq + s * U * 32, xm + s * U, out + (u64)dst[j] * n_out, U, n_out, wpr, blockIdx.x); \
    }
MOE_GEMV(q4_0, QT_Q4_0)
MOE_GEMV(q4_1, QT_Q4_1)
MOE_GEMV(q5_0, QT_Q5_0)
MOE_GEMV(q5_1, QT_Q5_1)
MOE_GEMV(q8_0, QT_Q8_0)
MOE_GEMV(q4_K, QT_Q4_K)
MOE_GEMV(q5_K, QT_Q5_K)
MOE_GEMV(q6_K, QT_Q6_K)

// The selection key of a value: larger keys rank first; equal keys are equal values (-0 and +0
// alike); NaN is 0, below every number (quarrel_core::moe::route_with's order: larger first,
// NaN last, ties by the lower index, which the caller breaks).
__device__ __forceinline__ u32 route_key(float v) {
    if (v != v) return 0u;
    const u32 b = __float_as_uint(v == 0.f ? 0.f : v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The warp's largest (MAX) or smallest v: one redux instruction from sm_80 on, else shuffles.
template <bool MAX>
__device__ __forceinline__ u32 warp_ext_u32(u32 v) {
#if __CUDA_ARCH__ >= 800
    return MAX ? __reduce_max_sync(0xffffffffu, v) : __reduce_min_sync(0xffffffffu, v);
#else
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const u32 w = __shfl_xor_sync(0xffffffffu, v, o);
        v = MAX ? max(v, w) : min(v, w);
    }
    return v;
#endif
}

// One token's routing by one warp, as quarrel_core::moe::route_reference computes it: gating 0
// softmax (exp(x - max) correctly rounded, the sum in f64, times 1/sum), 1 sigmoid, 2 the logits
// themselves with the chosen ones' softmax as their weights (GPT-OSS); selection =
// probability + bias; the n_used best (route_key order, ties by the lower expert), each pick one
// max and one min warp reduction over the lanes' best remaining expert; weights the unbiased
// probabilities, optionally divided by their f64 sum (at least 2^-14) and scaled. Lane k writes
// route k of the token (eids / wts at [0, n_used)) and counts it (counts non-null).
// row: the token's logits, read through L2 (__ldcg: other blocks of the same kernel may have
// written them); probs / sel: 2 * n_expert floats of shared memory for this warp; n_expert <= 1024.
__device__ __forceinline__ void route_warp(const float* row, const float* __restrict__ bias, float* probs, float* sel, u32* __restrict__ eids,
                                           float* __restrict__ wts, unsigned long long* __restrict__ counts, int n_expert, int n_used,
                                           int gating, int norm, float scale) {
    const int lane = threadIdx.x % 32;
    if (gating == 1) {
        for (int e = lane; e < n_expert; e += 32) probs[e] = __fdiv_rn(1.f, __fadd_rn(1.f, (float)exp(-(double)__ldcg(row + e))));
    } else if (gating == 2) {
        for (int e = lane; e < n_expert; e += 32) probs[e] = __ldcg(row + e);
    } else {
        float mx = -INF;
        for (int e = lane; e < n_expert; e += 32) mx = fmaxf(mx, __ldcg(row + e));
        mx = warp_max(mx);
        double sum = 0.0;
        for (int e = lane; e < n_expert; e += 32) {
            float o = (float)exp((double)__fsub_rn(__ldcg(row + e), mx));
            probs[e] = o;
            sum += (double)o;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        const float inv = (float)(1.0 / sum);
        for (int e = lane; e < n_expert; e += 32) probs[e] = __fmul_rn(probs[e], inv);
    }
    for (int e = lane; e < n_expert; e += 32) sel[e] = bias ? __fadd_rn(probs[e], bias[e]) : probs[e];
    __syncwarp();
    u32 taken = 0;  // bit i: expert lane + 32 i chosen
    u32 mine = 0;   // lane k: the k-th pick
    float mw = 0.f;
    double wsum = 0.0;  // every lane sums the picks' probabilities in pick order
    for (int k = 0; k < n_used; k++) {
        u32 bk = 0u, bi = 0xffffffffu;  // this lane's best remaining expert (none: index max)
        for (int e = lane, i = 0; e < n_expert; e += 32, i++) {
            if ((taken >> i) & 1u) continue;
            const u32 key = route_key(sel[e]);
            if (bi == 0xffffffffu || key > bk) {  // ascending e: a tie keeps the lower index
                bk = key;
                bi = (u32)e;
            }
        }
        const u32 mk = warp_ext_u32<true>(bk);
        const u32 best = warp_ext_u32<false>(bk == mk ? bi : 0xffffffffu);
        if ((int)(best % 32) == lane) taken |= 1u << (best / 32);
        const float p = probs[best];
        wsum += (double)p;
        if (lane == k) {
            mine = best;
            mw = p;
        }
    }
    if (gating == 2) {
        // softmax over the chosen logits in pick order (softmax_reference: the sum in f64)
        float mx = -INF;
        for (int k = 0; k < n_used; k++) mx = fmaxf(mx, __shfl_sync(0xffffffffu, mw, k));
        const float o = lane < n_used ? (float)exp((double)__fsub_rn(mw, mx)) : 0.f;
        double sum = 0.0;
        for (int k = 0; k < n_used; k++) sum += (double)__shfl_sync(0xffffffffu, o, k);
        mw = __fmul_rn(o, (float)(1.0 / sum));
        wsum = 0.0;
        for (int k = 0; k < n_used; k++) wsum += (double)__shfl_sync(0xffffffffu, mw, k);
    }
    if (lane < n_used) {
        const float s = fmaxf((float)wsum, 6.103515625e-5f);
        float x = mw;
        if (norm) x = __fdiv_rn(x, s);
        if (scale != 0.f && scale != 1.f) x = __fmul_rn(x, scale);
        eids[lane] = mine;
        wts[lane] = x;
        if (counts) atomicAdd(counts + mine, 1ull);
    }
    __syncwarp();  // every lane's reads of probs done before the warp's next token overwrites them
}

// The router on the device (steps routed by a separate router matmul): one warp per token
// (blockIdx.x), route_warp. Writes eids / wts token-major. Shared memory: 2 * n_expert floats.
extern "C" __global__ void moe_route(const float* __restrict__ logits, const float* __restrict__ bias, u32* __restrict__ eids,
                                     float* __restrict__ wts, unsigned long long* __restrict__ counts, int n_expert, int n_used,
                                     int gating, int norm, float scale) {
    GDC();
    extern __shared__ float rs[];
    const u64 t = blockIdx.x;
    route_warp(logits + t * n_expert, bias, rs, rs + n_expert, eids + t * n_used, wts + t * n_used, counts, n_expert, n_used, gating,
               norm, scale);
}

// The router matmul and the routing in one launch (decode steps, f32 router weights): every
// block computes its rows of logits = x · Wᵀ for the NT tokens exactly as gemv_f32_NT does (the
// same grid and warps per row: the same bits), and with xq set its share of x's Q8 form
// (quantize_q8's bits: the expert matmuls that follow need no quantize launch); the block that
// finishes last (a counter at cnt, reset by it) routes every token (route_warp, one warp per
// token) from the logits the others wrote. Dynamic shared memory: GEMV_WARPS * 2 * n_expert floats.
#define MOE_ROUTER_F32(NT)                                                                                            \
    extern "C" __global__ void __launch_bounds__(128) moe_router_f32_##NT(const u8* __restrict__ W, const float* __restrict__ x, \
        float* __restrict__ logits, int n_in, int n_expert, int wpr, const float* __restrict__ bias, u32* __restrict__ eids,  \
        float* __restrict__ wts, unsigned long long* __restrict__ counts, int n_used, int gating, int norm, float scale,     \
        u32* __restrict__ cnt, i8* __restrict__ xq, float2* __restrict__ xm) {                                        \
        gemv_f<WT_F32, NT>(W, x, logits, n_in, n_expert, wpr); /* begins with the prefetch and GDC() */               \
        moe_router_tail(x, logits, n_in, n_expert, NT, bias, eids, wts, counts, n_used, gating, norm, scale, cnt, xq, xm);  \
    }

__device__ __forceinline__ void moe_router_tail(const float* __restrict__ x, float* logits, int n_in, int n_expert, int n_tok,
                                                const float* __restrict__ bias, u32* __restrict__ eids, float* __restrict__ wts,
                                                unsigned long long* __restrict__ counts, int n_used, int gating, int norm, float scale,
                                                u32* __restrict__ cnt, i8* __restrict__ xq, float2* __restrict__ xm) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (xq) {
        const int nb = n_tok * n_in / 32;
        for (int b = blockIdx.x * GEMV_WARPS + warp; b < nb; b += gridDim.x * GEMV_WARPS) q8_store(x[(u64)b * 32 + lane], xq, xm, (u64)b);
    }
    __shared__ u32 last;
    __threadfence();  // this block's logits visible to the block that routes
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(cnt, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    extern __shared__ float route_sm[];
    for (int t = warp; t < n_tok; t += GEMV_WARPS) {
        float* pr = route_sm + (u64)warp * 2 * n_expert;
        route_warp(logits + (u64)t * n_expert, bias, pr, pr + n_expert, eids + (u64)t * n_used, wts + (u64)t * n_used, counts, n_expert,
                   n_used, gating, norm, scale);
    }
    if (threadIdx.x == 0) *cnt = 0u;  // ready for the next launch
}
MOE_ROUTER_F32(1)
MOE_ROUTER_F32(2)
MOE_ROUTER_F32(4)
MOE_ROUTER_F32(8)

// Before waiting for the previous kernel (PDL): when the routing was written at least two
// launches back (`early`: the kernel right before has waited for it, so it is complete and
// visible), prefetch this block's rows of the routed expert into L2, as the dense GEMV does.
template <int QT>
__device__ __forceinline__ void moe_prefetch(const u8* P, const u8* M, u64 slice_p, u64 slice_m, const u32* __restrict__ eids, int j,
                                             int early, int U, int n_out, int wpr) {
    if (!early) return;
    const u64 e = eids[j];
    gemv_prefetch<QT>(P + e * slice_p, M ? M + e * slice_m : M, U, n_out, wpr, blockIdx.x);
}

// moe_gemv with the routes on the device (moe_route): launch row j is route j, expert eids[j]
// at P + eid * slice_p (M + eid * slice_m), input row j / n_used (x per token) or j.
// moe_gemv2_dev: two matrices of one shape over the same input and routes (gate and up) in
// one launch, blockIdx.z choosing the matrix; every row computed as by moe_gemv_dev.
#define MOE_GEMV_DEV(NAME, QT)                                                                                        \
    extern "C" __global__ void __launch_bounds__(128) moe_gemv_dev_##NAME(const u8* __restrict__ P, const u8* __restrict__ M, \
        u64 slice_p, u64 slice_m, const u32* __restrict__ eids, int n_used, int per_token, const i8* __restrict__ xq,      \
        const float2* __restrict__ xm, float* __restrict__ out, int U, int n_out, int wpr, int early) {                    \
        const int j = blockIdx.y;                                                                                      \
        moe_prefetch<QT>(P, M, slice_p, slice_m, eids, j, early, U, n_out, wpr);                                       \
        GDC();                                                                                                         \
        const u64 e = eids[j], s = per_token ? j / n_used : j;                                                         \
        gemv_q<QT, 1, false, MOE_GEMV_UNROLL>(P + e * slice_p, M ? M + e * slice_m : M, xq + s * U * 32, xm + s * U, out + (u64)j * n_out, U, n_out, wpr, blockIdx.x); \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(128) moe_gemv2_dev_##NAME(const u8* __restrict__ P0, const u8* __restrict__ M0, \
        float* __restrict__ out0, const u8* __restrict__ P1, const u8* __restrict__ M1, float* __restrict__ out1, u64 slice_p, \
        u64 slice_m, const u32* __restrict__ eids, int n_used, int per_token, const i8* __restrict__ xq,                  \
        const float2* __restrict__ xm, int U, int n_out, int wpr, int early) {                                          \
        const int j = blockIdx.y;                                                                                      \
        const u8* P = blockIdx.z ? P1 : P0;                                                                            \
        const u8* M = blockIdx.z ? M1 : M0;                                                                            \
        float* out = blockIdx.z ? out1 : out0;                                                                         \
        moe_prefetch<QT>(P, M, slice_p, slice_m, eids, j, early, U, n_out, wpr);                                       \
        GDC();                                                                                                         \
        const u64 e = eids[j], s = per_token ? j / n_used : j;                                                         \
        gemv_q<QT, 1, false, MOE_GEMV_UNROLL>(P + e * slice_p, M ? M + e * slice_m : M, xq + s * U * 32, xm + s * U, out + (u64)j * n_out, U, n_out, wpr, blockIdx.x); \
    }

MOE_GEMV_DEV(q4_0, QT_Q4_0)
MOE_GEMV_DEV(q4_1, QT_Q4_1)
MOE_GEMV_DEV(q5_0, QT_Q5_0)
MOE_GEMV_DEV(q5_1, QT_Q5_1)
MOE_GEMV_DEV(q8_0, QT_Q8_0)
MOE_GEMV_DEV(q4_K, QT_Q4_K)
MOE_GEMV_DEV(q5_K, QT_Q5_K)
MOE_GEMV_DEV(q6_K, QT_Q6_K)

// moe_combine with the routes on the device: token t's routes are t * n_used .. + n_used, in
// order, weights w (the same sum, in the same order, as moe_combine).
extern "C" __global__ void moe_combine_dev(const float* __restrict__ y, const float* __restrict__ w, float* __restrict__ out, int d,
                                           int n_tok, int n_used, int fresh) {
    GDC();
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (u64)n_tok * d) return;
    u64 t = g / d, i = g % d;
    float a = fresh ? 0.f : out[g];
    for (u32 r = t * n_used; r < (t + 1) * n_used; r++) a = __fmaf_rn(y[(u64)r * d + i], w[r], a);
    out[g] = a;
}

// Expert GEMV over chunks of 8 routes of one expert (prefill steps with few routes per expert):
// chunk c (blockIdx.y) multiplies the 8 gathered rows c * 8 .. of x (Q8: xq, xm) by its
// expert's planes wp[c] / wm[c] into rows c * 8 .. of out; padding rows repeat a real row and
// are dropped by moe_unpad_rows. Per row the arithmetic of the decode GEMV (gemv_q's tokens
// accumulate independently), so a prefill's experts give decode's bits.
#define MOE_GEMV8(NAME, QT)                                                                                           \
    extern "C" __global__ void __launch_bounds__(128) moe_gemv8_##NAME(const u64* __restrict__ wp, const u64* __restrict__ wm, \
        const i8* __restrict__ xq, const float2* __restrict__ xm, float* __restrict__ out, int U, int n_out, int wpr) {      \
        const u64 c = blockIdx.y;                                                                                      \
        gemv_q<QT, 8>((const u8*)wp[c], (const u8*)wm[c], xq + c * 8 * U * 32, xm + c * 8 * U, out + c * 8 * n_out, U, n_out, wpr, blockIdx.x); \
    }
MOE_GEMV8(q4_0, QT_Q4_0)
MOE_GEMV8(q4_1, QT_Q4_1)
MOE_GEMV8(q5_0, QT_Q5_0)
MOE_GEMV8(q5_1, QT_Q5_1)
MOE_GEMV8(q8_0, QT_Q8_0)
MOE_GEMV8(q4_K, QT_Q4_K)
MOE_GEMV8(q5_K, QT_Q5_K)
MOE_GEMV8(q6_K, QT_Q6_K)

// out[dst[j] * d + i] = y[src[j] * d + i]: the real rows of the chunked result, to route order.
extern "C" __global__ void moe_unpad_rows(const float* __restrict__ y, const u32* __restrict__ src, const u32* __restrict__ dst,
                                          float* __restrict__ out, int d, int n) {
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (u64)n * d) return;
    u64 j = g / d, i = g % d;
    out[(u64)dst[j] * d + i] = y[(u64)src[j] * d + i];
}

// The grouped expert matmul's work items from device routes (prefill steps routed by
// moe_route, no host round trip): eids[j] (j < n_routes, token-major, n_used per token) ->
// src / dst (routes grouped by expert: activation row j / n_used or j, output row j) and per
// token tile class t (16 << t routes) the items {expert planes, offset | count << 32} at
// items[(t * max_items + k) * 3], their count n_items[t]. split_tab[r] (r <= 128): the first
// tile of the cheapest split of r routes (src/moe/grouped_gemm.rs `split`: full 128-route items first). Routes of
// an expert land in its items in any order: each route's sums do not depend on the others.
// one != 0: every item in the 128-route class (one launch; its kernel skips the empty token
// tiles), the full items first, then each expert's remainder (the cheap blocks run last and
// fill the final wave). One block of 1024 threads; shared memory 2 * n_expert u32.
extern "C" __global__ void __launch_bounds__(1024) moe_plan(const u32* __restrict__ eids, int n_routes, int n_used, int per_token,
        int n_expert, const u8* P, const u8* M, u64 slice_p, u64 slice_m, const u8* __restrict__ split_tab, u32* __restrict__ src,
        u32* __restrict__ dst, u64* __restrict__ items, int max_items, u32* __restrict__ n_items, int one) {
    extern __shared__ u32 plan_sm[];
    u32* cnt = plan_sm;
    u32* base = plan_sm + n_expert;
    __shared__ u32 ncls[4];
    __shared__ u32 nfull;
    const int tid = threadIdx.x, nt = blockDim.x;
    for (int e = tid; e < n_expert; e += nt) cnt[e] = 0;
    if (tid < 4) ncls[tid] = 0;
    __syncthreads();
    for (int j = tid; j < n_routes; j += nt) {
        const u32 e = eids[j];
        if (e < (u32)n_expert) atomicAdd(&cnt[e], 1u);
    }
    __syncthreads();
    if (tid == 0) {
        u32 s = 0, f = 0;
        for (int e = 0; e < n_expert; e++) {
            base[e] = s;
            s += cnt[e];
            f += cnt[e] / 128;
        }
        nfull = f;
    }
    __syncthreads();
    for (int e = tid; e < n_expert; e += nt) {
        u32 r = cnt[e], off = base[e];
        const u64 p = (u64)(P + (u64)e * slice_p), m = M ? (u64)(M + (u64)e * slice_m) : 0ull;
        while (r > 0) {
            const int t = one ? 3 : (r > 128 ? 3 : split_tab[r]);
            const u32 n = min(r, 16u << t);
            const u32 k = !one ? atomicAdd(&ncls[t], 1u) : (n == 128 ? atomicAdd(&ncls[0], 1u) : nfull + atomicAdd(&ncls[1], 1u));
            if (k < (u32)max_items) {
                u64* it = items + ((u64)t * max_items + k) * 3;
                it[0] = p;
                it[1] = m;
                it[2] = (u64)off | ((u64)n << 32);
            }
            off += n;
            r -= n;
        }
    }
    __syncthreads();
    for (int e = tid; e < n_expert; e += nt) cnt[e] = 0;
    __syncthreads();
    for (int j = tid; j < n_routes; j += nt) {
        const u32 e = eids[j];
        if (e >= (u32)n_expert) continue;
        const u32 pos = base[e] + atomicAdd(&cnt[e], 1u);
        src[pos] = per_token ? (u32)(j / n_used) : (u32)j;
        dst[pos] = (u32)j;
    }
    if (tid < 4) n_items[tid] = !one ? min(ncls[tid], (u32)max_items) : (tid == 3 ? min(ncls[0] + ncls[1], (u32)max_items) : 0u);
}
