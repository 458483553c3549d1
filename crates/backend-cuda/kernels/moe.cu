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
// a token's routes are ridx[off[t] .. off[t + 1]].
extern "C" __global__ void moe_combine(const float* __restrict__ y, const u32* __restrict__ ridx, const float* __restrict__ w,
                                       const u32* __restrict__ off, float* __restrict__ out, int d, int n_tok) {
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (u64)n_tok * d) return;
    u64 t = g / d, i = g % d;
    float a = out[g];
    for (u32 r = off[t]; r < off[t + 1]; r++) a += y[(u64)ridx[r] * d + i] * w[r];
    out[g] = a;
}

// x = max(x, 0)²
extern "C" __global__ void relu_sqr(float* __restrict__ x, u64 n) {
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n) return;
    float v = fmaxf(x[g], 0.f);
    x[g] = v * v;
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
