// GELU-gated feed-forward activation (Gemma): out = gelu(g) * u with llama.cpp's CPU GELU, read
// from the same f16 table the CPU backend builds (quarrel_core::act, uploaded once): the input
// rounded to f16 indexes the table; at or below -10 the output is 0, at or above 10 g * u.
// xq/xm non-null (n a multiple of 32): the output is also written as Q8 for the next matmul.
extern "C" __global__ void geglu(const float* __restrict__ g, const float* __restrict__ u, const u16* __restrict__ table,
                                 float* __restrict__ out, u64 n, i8* __restrict__ xq, float2* __restrict__ xm) {
    GDC();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = g[i];
    float o;
    if (v <= -10.0f) {
        o = 0.0f;
    } else if (v >= 10.0f) {
        o = __fmul_rn(v, u[i]);
    } else {
        o = __fmul_rn(h2f(table[f2h(v)]), u[i]);
    }
    out[i] = o;
    if (xq) q8_store(o, xq, xm, i / 32);
}

// x = gelu(x) in place through the same table (BERT's feed-forward); xq/xm as geglu's.
extern "C" __global__ void gelu(float* __restrict__ x, const u16* __restrict__ table, u64 n, i8* __restrict__ xq, float2* __restrict__ xm) {
    GDC();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    float o = v <= -10.0f ? 0.0f : v >= 10.0f ? v : h2f(table[f2h(v)]);
    x[i] = o;
    if (xq) q8_store(o, xq, xm, i / 32);
}
