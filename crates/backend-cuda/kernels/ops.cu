// Row and element-wise ops with the CPU backend's numerics (ggml's): RMSNorm summed in double,
// RoPE angles multiplied up step by step, SiLU as x / (1 + e^-x).

// The row functions (norm_row, norm_row_v4, ...) are in norm_row.cuh (the unit opens with it).

extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out, int d, float eps,
                                    i8* __restrict__ xq, float2* __restrict__ xm) {
    GDC();
    norm_row<false>((float*)x, nullptr, 1.0f, w, out, d, eps, xq, xm);
}

// ggml's norm as its AVX-512 build computes it (the CPU backend's layer_norm), times w plus b:
// one block per row; the mean summed in double; the centered squares of each 16-value block
// reduced pairwise in float (_mm512_reduce_add_ps's order), block sums and the tail in double.
extern "C" __global__ void layer_norm(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                                      float* __restrict__ out, int d, float eps) {
    GDC();
    __shared__ double part[32];
    const float* xr = x + (u64)blockIdx.x * d;
    float* orow = out + (u64)blockIdx.x * d;
    double s = 0.0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) s += (double)xr[i];
    const float mean = __fdiv_rn((float)block_sum_d(s, part), (float)d);
    __syncthreads();
    const int blocks = d / 16;
    double acc = 0.0;
    for (int k = threadIdx.x; k < blocks; k += blockDim.x) {
        float p[16];
#pragma unroll
        for (int j = 0; j < 16; j++) {
            float c = __fsub_rn(xr[k * 16 + j], mean);
            p[j] = __fmul_rn(c, c);
        }
        float h[8];
#pragma unroll
        for (int j = 0; j < 8; j++) h[j] = __fadd_rn(p[j + 8], p[j]);
        float q0 = __fadd_rn(h[4], h[0]), q1 = __fadd_rn(h[5], h[1]), q2 = __fadd_rn(h[6], h[2]), q3 = __fadd_rn(h[7], h[3]);
        acc += (double)__fadd_rn(__fadd_rn(q0, q2), __fadd_rn(q1, q3));
    }
    for (int i = blocks * 16 + threadIdx.x; i < d; i += blockDim.x) {
        float c = __fsub_rn(xr[i], mean);
        acc += (double)__fmul_rn(c, c);
    }
    const float variance = (float)(block_sum_d(acc, part) / (double)d);
    const float scale = 1.0f / sqrtf(variance + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        orow[i] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(xr[i], mean), scale), w[i]), b[i]);
    }
}

extern "C" __global__ void add_rms_norm(float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ w, float* __restrict__ out,
                                        int d, float eps, i8* __restrict__ xq, float2* __restrict__ xm) {
    GDC();
    norm_row<false>(x, y, 1.0f, w, out, d, eps, xq, xm);
}

// add_rms_norm whose y is first the MoE combine held before it (the decode step's
// moe_combine_dev, add and RMSNorm in one launch; d % 4 == 0, blockDim % 32 == 0; at most 64
// registers: a row of 4,096 values takes 1,024 threads).
extern "C" __global__ void __launch_bounds__(1024) comb_add_rms_norm(float* __restrict__ x, float* __restrict__ y, const float* __restrict__ cy,
                                             const float* __restrict__ cw, int n_used, int fresh, const float* __restrict__ w,
                                             float* __restrict__ out, int d, float eps, i8* __restrict__ xq, float2* __restrict__ xm) {
    GDC();
    norm_row_v4<false, true>(x, y, 1.0f, w, out, d, eps, xq, xm, Comb{cy, cw, n_used, fresh});
}

extern "C" __global__ void __launch_bounds__(1024) comb_add_scaled_rms_norm(float* __restrict__ x, float* __restrict__ y, const float* __restrict__ cy,
                                                    const float* __restrict__ cw, int n_used, int fresh, float ys,
                                                    const float* __restrict__ w, float* __restrict__ out, int d, float eps,
                                                    i8* __restrict__ xq, float2* __restrict__ xm) {
    GDC();
    norm_row_v4<true, true>(x, y, ys, w, out, d, eps, xq, xm, Comb{cy, cw, n_used, fresh});
}

// add_rms_norm with x += ys * y (Granite's residual multiplier; the product rounded first).
extern "C" __global__ void add_scaled_rms_norm(float* __restrict__ x, const float* __restrict__ y, float ys, const float* __restrict__ w,
                                               float* __restrict__ out, int d, float eps, i8* __restrict__ xq, float2* __restrict__ xm) {
    GDC();
    norm_row<true>(x, y, ys, w, out, d, eps, xq, xm);
}

// (best, idx) of the warp's lanes merged: the larger value, the lower index among equals (a
// macro: the two reductions of row_argmax compile exactly as written out).
#define ARGMAX_WARP(best, idx)                                                  \
    _Pragma("unroll") for (int o = 16; o > 0; o >>= 1) {                        \
        float ov = __shfl_xor_sync(0xffffffffu, best, o);                       \
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);                          \
        if (ov > best || (ov == best && oi < idx)) {                            \
            best = ov;                                                          \
            idx = oi;                                                           \
        }                                                                       \
    }

// The index of the largest of r[0..dim) in every thread of the block: the first on ties, NaN
// never chosen (except at index 0, where the host loop `v > best` would keep it).
__device__ __forceinline__ u32 row_argmax(const float* __restrict__ r, int dim) {
    __shared__ float bv[32];
    __shared__ int bi[32];
    float best = -INF;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = r[i];
        if (v > best) {  // strided in increasing i: the first of equals is kept
            best = v;
            idx = i;
        }
    }
    ARGMAX_WARP(best, idx)
    if (threadIdx.x % 32 == 0) {
        bv[threadIdx.x / 32] = best;
        bi[threadIdx.x / 32] = idx;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        bool have = threadIdx.x < blockDim.x / 32;
        best = have ? bv[threadIdx.x] : -INF;
        idx = have ? bi[threadIdx.x] : 0x7fffffff;
        ARGMAX_WARP(best, idx)
        if (threadIdx.x == 0) bi[0] = (r[0] != r[0] || idx == 0x7fffffff) ? 0 : idx;
    }
    __syncthreads();
    const u32 a = (u32)bi[0];
    __syncthreads();  // bi may be reused by the caller's next call
    return a;
}

// One block per row of `dim` values: out[row] = row_argmax of the row.
extern "C" __global__ void argmax_rows(const float* __restrict__ x, u32* __restrict__ out, int dim) {
    GDC();
    u32 a = row_argmax(x + (u64)blockIdx.x * dim, dim);
    if (threadIdx.x == 0) out[blockIdx.x] = a;
}

// Pair i of one head's row h rotated in place for position p; the indices and values written
// go to (i0, y0), (i1, y1).
__device__ __forceinline__ void rope_pair(float* __restrict__ h, u32 p, const float* __restrict__ ff, int i, int half, float theta_scale,
                                          float freq_scale, int neox, int* i0, int* i1, float* y0, float* y1,
                                          const float* __restrict__ yr = nullptr, float mscale = 1.0f) {
    *i0 = neox ? i : 2 * i;
    *i1 = neox ? i + half : 2 * i + 1;
    rope_rot_s(h[*i0], h[*i1], p, ff, i, theta_scale, freq_scale, yr, mscale, y0, y1);
    h[*i0] = *y0;
    h[*i1] = *y1;
}

// x (n_tok, n_head, hd) rotated in place; one thread per (token, head, pair). x2 non-null:
// x2 (n_tok, n_head2, hd) too, by the same positions (q and k in one launch). yr / mscale:
// YaRN's per-pair blend weights (null: none) and the magnitude (rope_rot_s).
extern "C" __global__ void rope(float* __restrict__ x, const u32* __restrict__ pos, const float* __restrict__ ff, int n_tok, int n_head,
                                int hd, int n_rot, float theta_scale, float freq_scale, int neox, float* __restrict__ x2, int n_head2,
                                const float* __restrict__ yr, float mscale) {
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
    int i0, i1;
    float y0, y1;
    rope_pair(x + th * hd, pos[t], ff, i, half, theta_scale, freq_scale, neox, &i0, &i1, &y0, &y1, yr, mscale);
}

// xq/xm non-null (n a multiple of 32): the output is also written as Q8.
// ggml_vec_swiglu_f32's numerics (the CPU backend's): ggml_v_silu on the values of the whole
// 16-wide vectors, libm's expf on the last n % 16.
extern "C" __global__ void swiglu(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ out, u64 n,
                                  i8* __restrict__ xq, float2* __restrict__ xm) {
    GDC();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = g[i];
    float s = i < (n & ~15ull) ? silu_ggml(v) : __fdiv_rn(v, __fadd_rn(1.0f, expf_libm(-v)));
    float o = __fmul_rn(s, u[i]);
    out[i] = o;
    if (xq) q8_store(o, xq, xm, i / 32);
}

// GPT-OSS's clamped SwiGLU (ggml_swiglu_oai, the CPU backend's numerics: libm's expf):
// x = min(g, limit), y = clamp(u, -limit, limit), out = x / (1 + exp(-alpha x)) * (y + 1).
// xq/xm as swiglu's.
extern "C" __global__ void swiglu_oai(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ out, u64 n,
                                      float alpha, float limit, i8* __restrict__ xq, float2* __restrict__ xm) {
    GDC();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = fminf(g[i], limit);
    float y = fminf(fmaxf(u[i], -limit), limit);
    float s = __fdiv_rn(x, __fadd_rn(1.0f, expf_libm(__fmul_rn(alpha, -x))));
    float o = __fmul_rn(s, __fadd_rn(y, 1.0f));
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

// x += s * y, the product rounded first (scale-then-add's bits: no FMA).
extern "C" __global__ void add_scaled(float* __restrict__ x, const float* __restrict__ y, float s, u64 n) {
    GDC();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fadd_rn(x[i], __fmul_rn(y[i], s));
}

// x (rows, d) += b (d) on every row.
extern "C" __global__ void add_bias(float* __restrict__ x, const float* __restrict__ b, u64 d, u64 n) {
    GDC();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += b[i % d];
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

// One Q8_0 block from a warp (lane i holds value i): quarrel_quant's q8_0::quantize_row.
__device__ __forceinline__ void kv_q8_0_block(float v, u8* __restrict__ blk, int lane) {
    float amax = warp_max(fabsf(v));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    blk[2 + lane] = (u8)(i8)(int)roundf(v * id);
    if (lane == 0) *(u16*)blk = f2h(d);
}

// One Q4_0 block from a warp: quarrel_quant's q4_0::quantize_row_mse (the KV cache's format):
// scales mapping the largest magnitude to +-4 .. +-10 levels in steps of 1/4, rounded to f16,
// the one with the least squared error kept (errors summed in the CPU's order, so the same
// scale wins).
__device__ __forceinline__ void kv_q4_0_block(float v, u8* __restrict__ blk, int lane) {
    float amax = warp_max(fabsf(v));
    unsigned mask = __ballot_sync(0xffffffffu, fabsf(v) == amax);
    float m = __shfl_sync(0xffffffffu, v, __ffs(mask) - 1);  // first of largest magnitude, sign kept
    float best_d = 0.f, best_err = INF;
    if (m != 0.f) {
        for (int si = 0; si < 2; si++) {
            float sign = si == 0 ? -1.0f : 1.0f;
            for (int step = 0; step <= 24; step++) {
                float levels = 4.0f + (float)step * 0.25f;
                float d = h2f(f2h(__fdiv_rn(m, sign * levels)));
                if (d == 0.0f || isinf(d) || isnan(d)) continue;
                float id = __fdiv_rn(1.0f, d);
                float q = fminf(fmaxf(roundf(__fmul_rn(v, id)), -8.0f), 7.0f);
                float e = __fsub_rn(v, __fmul_rn(q, d));
                float e2 = __fmul_rn(e, e);
                float err = 0.0f;
                for (int i = 0; i < 32; i++) err = __fadd_rn(err, __shfl_sync(0xffffffffu, e2, i));
                if (err < best_err) {
                    best_d = d;
                    best_err = err;
                }
            }
        }
    }
    float id = best_d != 0.0f ? __fdiv_rn(1.0f, best_d) : 0.0f;
    int q = (int)fminf(fmaxf(roundf(__fmul_rn(v, id)), -8.0f), 7.0f) + 8;
    int q_hi = __shfl_down_sync(0xffffffffu, q, 16);
    if (lane < 16) blk[2 + lane] = (u8)(q | (q_hi << 4));
    if (lane == 0) *(u16*)blk = f2h(best_d);
}

// Store one row of `row` values (token t) at slot `slot`. F32/F16: thread per value; quantized:
// Hadamard-rotated in blocks of `rot` values, then quarrel-quant's quantizers (warp per block).
// `off` (quantized keys only, else null): the layer's key offset, subtracted before rotating.
template <int KT>
__device__ __forceinline__ void kv_put(u8* __restrict__ dst, const float* __restrict__ src, const u32* __restrict__ slots, int row, int n_tok, int rot,
                                       const float* __restrict__ off) {
    GDC();
    if (KT == KV_F32 || KT == KV_F16) {
        u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
        if (g >= (u64)n_tok * row) return;
        u64 t = g / row, i = g % row;
        u64 e = (u64)slots[t] * row + i;
        if (KT == KV_F32) ((float*)dst)[e] = src[g];
        else ((u16*)dst)[e] = f2h(src[g]);
    } else {
        // quantized: each head's values Hadamard-rotated in blocks of `rot` before quantizing,
        // as the CPU's cache stores them (quarrel_quant::rotate); one warp per rotation block,
        // lane l holding values l + 32 k (k < rot / 32 <= 8)
        const int lane = threadIdx.x % 32, R = rot / 32;
        const int nch = row / rot, nb = row / 32;
        u64 wg = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
        if (wg >= (u64)n_tok * nch) return;
        u64 t = wg / nch, j = wg % nch;
        const float* s = src + t * row + j * rot;
        float v[8];
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = k < R ? (off ? __fsub_rn(s[lane + 32 * k], off[j * rot + lane + 32 * k]) : s[lane + 32 * k]) : 0.f;
        // butterflies in the CPU's order (h = 1, 2, 4, ...): x[i] = a + b, x[i + h] = a - b
#pragma unroll
        for (int h = 1; h < 32; h <<= 1) {
            if (h >= rot) break;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                if (k < R) {
                    float o = __shfl_xor_sync(0xffffffffu, v[k], h);
                    v[k] = (lane & h) ? __fsub_rn(o, v[k]) : __fadd_rn(v[k], o);
                }
            }
        }
#pragma unroll
        for (int hk = 1; hk < 8; hk <<= 1) {
            if (hk >= R) break;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                if (k < R && !(k & hk) && k + hk < 8) {
                    float a = v[k], b = v[k + hk];
                    v[k] = __fadd_rn(a, b);
                    v[k + hk] = __fsub_rn(a, b);
                }
            }
        }
        const float nrm = __fdiv_rn(1.0f, sqrtf((float)rot));
        u64 slot = slots[t];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            if (k >= R) break;
            float x = __fmul_rn(v[k], nrm);
            u64 ob = slot * nb + j * R + k;
            if (KT == KV_Q8_0) kv_q8_0_block(x, dst + ob * 34, lane);
            else kv_q4_0_block(x, dst + ob * 18, lane);
        }
    }
}

// blockIdx.y: 0 stores K, 1 stores V
#define KV_STORE(NAME, KT)                                                                                 \
    extern "C" __global__ void kv_store_##NAME(u8* kd, const float* ks, u8* vd, const float* vs, const u32* slots, \
                                               int row, int n_tok, int rot, const float* koff) {           \
        if (blockIdx.y == 0) kv_put<KT>(kd, ks, slots, row, n_tok, rot, koff);                             \
        else kv_put<KT>(vd, vs, slots, row, n_tok, rot, nullptr);                                          \
    }
KV_STORE(f32, KV_F32)
KV_STORE(f16, KV_F16)
KV_STORE(q8_0, KV_Q8_0)
KV_STORE(q4_0, KV_Q4_0)
// `rope` of q and k (whole heads rotated: n_rot == hd) and the store of k and v into an f32/f16
// cache (as kv_store_*) in one launch: threads [0, nq) rotate q pairs, [nq, nq + nk) k pairs
// (stored too), then one per v value. `row` = n_head2 * hd values per token.
template <int KT>
__device__ __forceinline__ void rope_kv(float* __restrict__ x, const u32* __restrict__ pos, const float* __restrict__ ff, int n_tok, int n_head,
                                        int hd, float theta_scale, float freq_scale, int neox, float* __restrict__ x2, int n_head2,
                                        u8* __restrict__ kd, u8* __restrict__ vd, const float* __restrict__ vs, const u32* __restrict__ slots,
                                        int row) {
    GDC();
    const int half = hd / 2;
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 nq = (u64)n_tok * n_head * half, nk = (u64)n_tok * n_head2 * half;
    int i0, i1;
    float y0, y1;
    if (g < nq) {
        u64 th = g / half;
        rope_pair(x + th * hd, pos[th / n_head], ff, (int)(g % half), half, theta_scale, freq_scale, neox, &i0, &i1, &y0, &y1);
    } else if (g < nq + nk) {
        g -= nq;
        u64 th = g / half, t = th / n_head2;
        rope_pair(x2 + th * hd, pos[t], ff, (int)(g % half), half, theta_scale, freq_scale, neox, &i0, &i1, &y0, &y1);
        u64 e = (u64)slots[t] * row + (th % n_head2) * hd;
        if (KT == KV_F32) {
            ((float*)kd)[e + i0] = y0;
            ((float*)kd)[e + i1] = y1;
        } else {
            ((u16*)kd)[e + i0] = f2h(y0);
            ((u16*)kd)[e + i1] = f2h(y1);
        }
    } else {
        g -= nq + nk;
        if (g >= (u64)n_tok * row) return;
        u64 t = g / row, i = g % row;
        u64 e = (u64)slots[t] * row + i;
        if (KT == KV_F32) ((float*)vd)[e] = vs[g];
        else ((u16*)vd)[e] = f2h(vs[g]);
    }
}

#define ROPE_KV(NAME, KT)                                                                                          \
    extern "C" __global__ void rope_kv_##NAME(float* x, const u32* pos, const float* ff, int n_tok, int n_head, int hd, \
                                              float theta_scale, float freq_scale, int neox, float* x2, int n_head2, u8* kd, \
                                              u8* vd, const float* vs, const u32* slots, int row) {                    \
        rope_kv<KT>(x, pos, ff, n_tok, n_head, hd, theta_scale, freq_scale, neox, x2, n_head2, kd, vd, vs, slots, row); \
    }
ROPE_KV(f32, KV_F32)
ROPE_KV(f16, KV_F16)
