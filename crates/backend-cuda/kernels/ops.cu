// Row and element-wise ops with the CPU backend's numerics (ggml's): RMSNorm summed in double,
// RoPE angles multiplied up step by step, SiLU as x / (1 + e^-x).

// One block per row: out = x * rsqrt(mean(x^2) + eps) * w.
// y non-null: x += y first (the residual add fused into the next norm; x is updated in place).
// xq/xm non-null (d a multiple of 32): the output is also written as Q8 for the next matmul.
__device__ __forceinline__ void norm_row(float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ w, float* __restrict__ out,
                                         int d, float eps, i8* __restrict__ xq, float2* __restrict__ xm) {
    __shared__ double part[32];
    float* xr = x + (u64)blockIdx.x * d;
    const float* yr = y ? y + (u64)blockIdx.x * d : nullptr;
    float* orow = out + (u64)blockIdx.x * d;
    double ss = 0.0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float v = xr[i];
        if (yr) {
            v = __fadd_rn(v, yr[i]);
            xr[i] = v;
        }
        ss += (double)__fmul_rn(v, v);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        double v = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    float mean = (float)(part[0] / (double)d);
    float scale = 1.0f / sqrtf(mean + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float o = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
        orow[i] = o;
        if (xq) q8_store(o, xq, xm, ((u64)blockIdx.x * d + i) / 32);
    }
}

extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out, int d, float eps,
                                    i8* __restrict__ xq, float2* __restrict__ xm) {
    GDC();
    norm_row((float*)x, nullptr, w, out, d, eps, xq, xm);
}

extern "C" __global__ void add_rms_norm(float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ w, float* __restrict__ out,
                                        int d, float eps, i8* __restrict__ xq, float2* __restrict__ xm) {
    GDC();
    norm_row(x, y, w, out, d, eps, xq, xm);
}

// One block per row of `dim` values: out[row] = the index of the largest value, the first on
// ties, NaN never chosen (except at index 0, where the host loop `v > best` would keep it).
extern "C" __global__ void argmax_rows(const float* __restrict__ x, u32* __restrict__ out, int dim) {
    GDC();
    __shared__ float bv[32];
    __shared__ int bi[32];
    const float* r = x + (u64)blockIdx.x * dim;
    float best = -INF;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = r[i];
        if (v > best) {  // strided in increasing i: the first of equals is kept
            best = v;
            idx = i;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > best || (ov == best && oi < idx)) {
            best = ov;
            idx = oi;
        }
    }
    if (threadIdx.x % 32 == 0) {
        bv[threadIdx.x / 32] = best;
        bi[threadIdx.x / 32] = idx;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        bool have = threadIdx.x < blockDim.x / 32;
        best = have ? bv[threadIdx.x] : -INF;
        idx = have ? bi[threadIdx.x] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, idx, o);
            if (ov > best || (ov == best && oi < idx)) {
                best = ov;
                idx = oi;
            }
        }
        if (threadIdx.x == 0) out[blockIdx.x] = (r[0] != r[0] || idx == 0x7fffffff) ? 0u : (u32)idx;
    }
}

// x (n_tok, n_head, hd) rotated in place; one thread per (token, head, pair). x2 non-null:
// x2 (n_tok, n_head2, hd) too, by the same positions (q and k in one launch).
extern "C" __global__ void rope(float* __restrict__ x, const u32* __restrict__ pos, const float* __restrict__ ff, int n_tok, int n_head,
                                int hd, int n_rot, float theta_scale, float freq_scale, int neox, float* __restrict__ x2, int n_head2) {
    GDC();
    int half = n_rot / 2;
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 n1 = (u64)n_tok * n_head * half;
    if (g >= n1) {
        if (!x2) return;
        g -= n1;
        x = x2;
        n_head = n_head2;
        if (g >= (u64)n_tok * n_head * half) return;
    }
    int i = (int)(g % half);
    u64 th = g / half;  // token * n_head + head
    int t = (int)(th / n_head);
    float theta = (float)pos[t];
    for (int k = 0; k < i; k++) theta = __fmul_rn(theta, theta_scale);
    float f = ff ? ff[i] : 1.0f;
    float a = __fmul_rn(freq_scale, __fdiv_rn(theta, f));
    float c = cosf(a), s = sinf(a);
    float* h = x + th * hd;
    int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
    float x0 = h[i0], x1 = h[i1];
    h[i0] = fmaf(x0, c, -__fmul_rn(x1, s));
    h[i1] = fmaf(x0, s, __fmul_rn(x1, c));
}

// xq/xm non-null (n a multiple of 32): the output is also written as Q8.
extern "C" __global__ void swiglu(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ out, u64 n,
                                  i8* __restrict__ xq, float2* __restrict__ xm) {
    GDC();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = g[i];
    float o = __fmul_rn(__fdiv_rn(v, 1.0f + expf(-v)), u[i]);
    out[i] = o;
    if (xq) q8_store(o, xq, xm, i / 32);
}

extern "C" __global__ void zero_fill(u32* __restrict__ x, u64 n) {
    GDC();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 0u;
}

extern "C" __global__ void add(float* __restrict__ x, const float* __restrict__ y, u64 n) {
    GDC();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

extern "C" __global__ void scale(float* __restrict__ x, float s, u64 n) {
    GDC();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

extern "C" __global__ void gather_rows(const float* __restrict__ x, const u32* __restrict__ rows, float* __restrict__ out, int dim, int n_rows) {
    GDC();
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (u64)n_rows * dim) return;
    u64 r = g / dim, i = g % dim;
    out[g] = x[(u64)rows[r] * dim + i];
}

// ---------------------------------------------------------------------------------------------
// KV cache: per layer [slots][n_kv_head * hd] in f32, f16, or ggml Q8_0 / Q4_0 blocks.
// ---------------------------------------------------------------------------------------------

#define KV_F32 0
#define KV_F16 1
#define KV_Q8_0 2
#define KV_Q4_0 3

// Store one row of `row` values (token t) at slot `slot`. F32/F16: thread per value; quantized:
// warp per 32-value block with ggml's reference quantizers (quarrel-quant's).
template <int KT>
__device__ __forceinline__ void kv_put(u8* __restrict__ dst, const float* __restrict__ src, const u32* __restrict__ slots, int row, int n_tok) {
    GDC();
    if (KT == KV_F32 || KT == KV_F16) {
        u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
        if (g >= (u64)n_tok * row) return;
        u64 t = g / row, i = g % row;
        u64 e = (u64)slots[t] * row + i;
        if (KT == KV_F32) ((float*)dst)[e] = src[g];
        else ((u16*)dst)[e] = f2h(src[g]);
    } else {
        u64 b = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
        int lane = threadIdx.x % 32;
        int nb = row / 32;
        if (b >= (u64)n_tok * nb) return;
        u64 t = b / nb, j = b % nb;
        float v = src[t * row + j * 32 + lane];
        u64 ob = (u64)slots[t] * nb + j;
        if (KT == KV_Q8_0) {
            float amax = warp_max(fabsf(v));
            float d = amax / 127.0f;
            float id = d != 0.0f ? 1.0f / d : 0.0f;
            u8* blk = dst + ob * 34;
            blk[2 + lane] = (u8)(i8)(int)roundf(v * id);
            if (lane == 0) *(u16*)blk = f2h(d);
        } else {
            // the value of largest magnitude, sign kept (first one on ties)
            float amax = warp_max(fabsf(v));
            unsigned mask = __ballot_sync(0xffffffffu, fabsf(v) == amax);
            int first = __ffs(mask) - 1;
            float m = __shfl_sync(0xffffffffu, v, first);
            float d = m / -8.0f;
            float id = d != 0.0f ? 1.0f / d : 0.0f;
            int q = (int)(i8)(v * id + 8.5f);
            q = q < 15 ? q : 15;
            int q_hi = __shfl_down_sync(0xffffffffu, q, 16);
            u8* blk = dst + ob * 18;
            if (lane < 16) blk[2 + lane] = (u8)(q | (q_hi << 4));
            if (lane == 0) *(u16*)blk = f2h(d);
        }
    }
}

// blockIdx.y: 0 stores K, 1 stores V
#define KV_STORE(NAME, KT)                                                                                 \
    extern "C" __global__ void kv_store_##NAME(u8* kd, const float* ks, u8* vd, const float* vs, const u32* slots, \
                                               int row, int n_tok) {                                       \
        if (blockIdx.y == 0) kv_put<KT>(kd, ks, slots, row, n_tok);                                        \
        else kv_put<KT>(vd, vs, slots, row, n_tok);                                                        \
    }
KV_STORE(f32, KV_F32)
KV_STORE(f16, KV_F16)
KV_STORE(q8_0, KV_Q8_0)
KV_STORE(q4_0, KV_Q4_0)
