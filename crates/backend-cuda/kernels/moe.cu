// Mixture-of-experts helpers: rows scattered back to route order after the grouped-by-expert
// matmul, the weighted combine of expert outputs per token, and relu² (Nemotron-H).

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
