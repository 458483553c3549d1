// The RMSNorm of one row by one block (device functions: ops.cu's norm kernels launch them,
// one block per row).
//
// out = x * rsqrt(mean(x^2) + eps) * w.
// y non-null: x += y first (the residual add fused into the next norm; x is updated in place);
// SC: x += ys * y instead, the product rounded before the add (scale-then-add's bits, no FMA).
// xq/xm non-null (d a multiple of 32): the output is also written as Q8 for the next matmul.
// The row's sum of squares is summed in double (each square rounded to f32 first, as ggml;
// block_sum_d), which makes the order of the sum immaterial in practice.

// y scaled by ys first when SC (the product rounded on its own).
template <bool SC>
__device__ __forceinline__ float ys_mul(float b, float ys) {
    return SC ? __fmul_rn(b, ys) : b;
}

// Any d: one value per thread and step.
template <bool SC>
__device__ __forceinline__ void norm_row_scalar(float* __restrict__ x, const float* __restrict__ y, float ys, const float* __restrict__ w,
                                                float* __restrict__ out, int d, float eps, i8* __restrict__ xq, float2* __restrict__ xm) {
    __shared__ double part[32];
    float* xr = x + (u64)blockIdx.x * d;
    const float* yr = y ? y + (u64)blockIdx.x * d : nullptr;
    float* orow = out + (u64)blockIdx.x * d;
    double ss = 0.0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float v = xr[i];
        if (yr) {
            v = __fadd_rn(v, ys_mul<SC>(yr[i], ys));
            xr[i] = v;
        }
        ss += (double)__fmul_rn(v, v);
    }
    float mean = (float)(block_sum_d(ss, part) / (double)d);
    float scale = 1.0f / sqrtf(mean + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float o = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
        orow[i] = o;
        if (xq) q8_store(o, xq, xm, ((u64)blockIdx.x * d + i) / 32);
    }
}

#define NORM_IT 4

// d a multiple of 4 (16-byte rows): each thread takes 4 consecutive values per step, the first
// NORM_IT steps kept in registers (all of a row of up to 4 * NORM_IT * blockDim values), so the
// row is read once with all loads in flight; 8 lanes make one Q8 block of the output.
// CB (a combine held before the add, `comb_add_*rms_norm`): the addend y is first the MoE
// combine of row blockIdx.x's n_used routes, y = (fresh ? 0 : y) + Σ cw[r] · cy[r], route by route
// (moe_combine_dev's sum and bits), written back to y, then added to x as without CB.
__device__ __forceinline__ float4 comb4(float* __restrict__ y, int c, const float* __restrict__ cy, const float* __restrict__ cw, int n_used,
                                        int fresh, int d) {
    float4 a = fresh ? make_float4(0.f, 0.f, 0.f, 0.f) : ((const float4*)y)[c];
    for (int r = blockIdx.x * n_used; r < (blockIdx.x + 1) * n_used; r++) {
        const float4 v = ((const float4*)(cy + (u64)r * d))[c];
        const float s = cw[r];
        a = make_float4(__fmaf_rn(v.x, s, a.x), __fmaf_rn(v.y, s, a.y), __fmaf_rn(v.z, s, a.z), __fmaf_rn(v.w, s, a.w));
    }
    ((float4*)y)[c] = a;
    return a;
}

struct Comb {
    const float* cy;
    const float* cw;
    int n_used, fresh;
};

template <bool SC, bool CB = false>
__device__ __forceinline__ void norm_row_v4(float* __restrict__ x, const float* __restrict__ y, float ys, const float* __restrict__ w,
                                            float* __restrict__ out, int d, float eps, i8* __restrict__ xq, float2* __restrict__ xm,
                                            Comb cb = Comb{nullptr, nullptr, 0, 0}) {
    __shared__ double part[32];
    const int n4 = d / 4;
    float4* xr = (float4*)(x + (u64)blockIdx.x * d);
    const float4* yr = y ? (const float4*)(y + (u64)blockIdx.x * d) : nullptr;
    const float4* w4 = (const float4*)w;
    float4* orow = (float4*)(out + (u64)blockIdx.x * d);
    const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 v[NORM_IT], wv[NORM_IT];
    double ss = 0.0;
#pragma unroll
    for (int it = 0; it < NORM_IT; it++) {
        int c = it * blockDim.x + threadIdx.x;
        v[it] = c < n4 ? xr[c] : z;
        // with a combine, the weights are read after the sum (registers: no spills at 1,024 threads)
        if (!CB) wv[it] = c < n4 ? w4[c] : z;
        if (yr && c < n4) {
            float4 b = CB ? comb4((float*)y + (u64)blockIdx.x * d, c, cb.cy, cb.cw, cb.n_used, cb.fresh, d) : yr[c];
            b = make_float4(ys_mul<SC>(b.x, ys), ys_mul<SC>(b.y, ys), ys_mul<SC>(b.z, ys), ys_mul<SC>(b.w, ys));
            v[it] = make_float4(__fadd_rn(v[it].x, b.x), __fadd_rn(v[it].y, b.y), __fadd_rn(v[it].z, b.z), __fadd_rn(v[it].w, b.w));
            xr[c] = v[it];
        }
    }
#pragma unroll
    for (int it = 0; it < NORM_IT; it++) {
        ss += (double)__fmul_rn(v[it].x, v[it].x);
        ss += (double)__fmul_rn(v[it].y, v[it].y);
        ss += (double)__fmul_rn(v[it].z, v[it].z);
        ss += (double)__fmul_rn(v[it].w, v[it].w);
    }
    for (int c = NORM_IT * blockDim.x + threadIdx.x; c < n4; c += blockDim.x) {
        float4 a = xr[c];
        if (yr) {
            float4 b = CB ? comb4((float*)y + (u64)blockIdx.x * d, c, cb.cy, cb.cw, cb.n_used, cb.fresh, d) : yr[c];
            b = make_float4(ys_mul<SC>(b.x, ys), ys_mul<SC>(b.y, ys), ys_mul<SC>(b.z, ys), ys_mul<SC>(b.w, ys));
            a = make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
            xr[c] = a;
        }
        ss += (double)__fmul_rn(a.x, a.x);
        ss += (double)__fmul_rn(a.y, a.y);
        ss += (double)__fmul_rn(a.z, a.z);
        ss += (double)__fmul_rn(a.w, a.w);
    }
    float mean = (float)(block_sum_d(ss, part) / (double)d);
    float scale = 1.0f / sqrtf(mean + eps);
    const int steps = (n4 + blockDim.x - 1) / blockDim.x;  // the same for every thread
    for (int it = 0; it < steps; it++) {
        int c = it * blockDim.x + threadIdx.x;
        float4 a = z, b = z;
        if (it < NORM_IT) {
#pragma unroll
            for (int k = 0; k < NORM_IT; k++)
                if (k == it) {
                    a = v[k];
                    b = CB ? (c < n4 ? w4[c] : z) : wv[k];
                }
        } else if (c < n4) {
            a = xr[c];
            b = w4[c];
        }
        float4 o = make_float4(__fmul_rn(__fmul_rn(a.x, scale), b.x), __fmul_rn(__fmul_rn(a.y, scale), b.y),
                               __fmul_rn(__fmul_rn(a.z, scale), b.z), __fmul_rn(__fmul_rn(a.w, scale), b.w));
        if (c < n4) orow[c] = o;
        if (xq) {
            // lanes 8g..8g+7 hold Q8 block (row * d + 4c) / 32: q8_store's arithmetic
            float amax = fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w)));
#pragma unroll
            for (int m = 1; m < 8; m <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
            float dd = amax / 127.0f;
            float id = amax != 0.0f ? 127.0f / amax : 0.0f;
            int q0 = (int)rintf(o.x * id), q1 = (int)rintf(o.y * id), q2 = (int)rintf(o.z * id), q3 = (int)rintf(o.w * id);
            int sum = q0 + q1 + q2 + q3;
#pragma unroll
            for (int m = 1; m < 8; m <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, m);
            if (c < n4) {
                u64 e = (u64)blockIdx.x * d + 4 * (u64)c;
                *(u32*)(xq + e) = (u32)(u8)q0 | ((u32)(u8)q1 << 8) | ((u32)(u8)q2 << 16) | ((u32)(u8)q3 << 24);
                if (threadIdx.x % 8 == 0) xm[e / 32] = make_float2(h2f(f2h(dd)), h2f(f2h(dd * (float)sum)));
            }
        }
    }
}

template <bool SC>
__device__ __forceinline__ void norm_row(float* __restrict__ x, const float* __restrict__ y, float ys, const float* __restrict__ w, float* __restrict__ out,
                                         int d, float eps, i8* __restrict__ xq, float2* __restrict__ xm) {
    if (d % 4 == 0 && blockDim.x % 32 == 0) norm_row_v4<SC>(x, y, ys, w, out, d, eps, xq, xm);
    else norm_row_scalar<SC>(x, y, ys, w, out, d, eps, xq, xm);
}

