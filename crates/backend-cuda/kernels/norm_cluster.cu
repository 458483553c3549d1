// RMSNorm (plain, after a residual add, after a scaled residual add) of rows of 2048+ values by
// a cluster of blocks (sm_90): compiled in the "ops" unit after ops.cu, whose norm helpers
// (norm_row_v4's column split, block_sum_d's order) it mirrors. Off by default
// (QUARREL_CUDA_NORM_CLUSTER=1): bit-identical to the one-block kernels and measured 0.6-0.9%
// slower end to end on a 7B decode step (H100, 2026-11-23).

// add_rms_norm / add_scaled_rms_norm / rms_norm of a row by a cluster of NORM_NC blocks
// (sm_90 thread-block clusters): the row split as one block of NORM_NC * blockDim threads would
// split it (thread g = rank * blockDim + tid takes norm_row_v4's float4 columns), the per-warp
// double sums exchanged through distributed shared memory and summed by every block as
// block_sum_d sums them — the single-block kernel's bits with NORM_NC SMs loading the row.
// Grid: NORM_NC blocks per row; d % 4 == 0, d / 4 <= NORM_IT * NORM_NC * blockDim, blockDim % 32
// == 0, NORM_NC * blockDim <= 1024. The residual sum is stored after the reduction (no global
// store pending at the cluster barrier).
#if __CUDA_ARCH__ >= 900
#define NORM_NC 4
template <bool SC>
__device__ __forceinline__ void norm_row_cl(float* __restrict__ x, const float* __restrict__ y, float ys, const float* __restrict__ w,
                                            float* __restrict__ out, int d, float eps, i8* __restrict__ xq, float2* __restrict__ xm) {
    __shared__ double part[32];
    u32 rank;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    const u64 r = blockIdx.x / NORM_NC;
    const int VT = NORM_NC * blockDim.x, g = (int)rank * blockDim.x + threadIdx.x;
    const int n4 = d / 4;  // <= NORM_IT * VT: the row held in registers
    float4* xr = (float4*)(x + r * d);
    const float4* yr = y ? (const float4*)(y + r * d) : nullptr;
    const float4* w4 = (const float4*)w;
    float4* orow = (float4*)(out + r * d);
    const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 v[NORM_IT], wv[NORM_IT];
    double ss = 0.0;
    // norm_row_v4's order
#pragma unroll
    for (int it = 0; it < NORM_IT; it++) {
        const int c = it * VT + g;
        v[it] = c < n4 ? xr[c] : z;
        wv[it] = c < n4 ? w4[c] : z;
        if (yr && c < n4) {
            float4 b = yr[c];
            b = make_float4(ys_mul<SC>(b.x, ys), ys_mul<SC>(b.y, ys), ys_mul<SC>(b.z, ys), ys_mul<SC>(b.w, ys));
            v[it] = make_float4(__fadd_rn(v[it].x, b.x), __fadd_rn(v[it].y, b.y), __fadd_rn(v[it].z, b.z), __fadd_rn(v[it].w, b.w));
        }
    }
#pragma unroll
    for (int it = 0; it < NORM_IT; it++) {
        ss += (double)__fmul_rn(v[it].x, v[it].x);
        ss += (double)__fmul_rn(v[it].y, v[it].y);
        ss += (double)__fmul_rn(v[it].z, v[it].z);
        ss += (double)__fmul_rn(v[it].w, v[it].w);
    }
    // block_sum_d over the cluster's NORM_NC * blockDim / 32 warps, in its order
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const int wpb = blockDim.x / 32;
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    double tot = 0.0;
    if (threadIdx.x < 32) {
        double vv = 0.0;
        if ((int)threadIdx.x < VT / 32) {
            u32 src = (u32)__cvta_generic_to_shared(&part[threadIdx.x % wpb]), dst;
            asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(dst) : "r"(src), "r"((u32)(threadIdx.x / wpb)));
            asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(vv) : "r"(dst) : "memory");
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) vv += __shfl_xor_sync(0xffffffffu, vv, o);
        tot = vv;
    }
    // every block's part read (the values are in registers) before any block leaves or
    // overwrites its own
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
    if (threadIdx.x == 0) part[0] = tot;
    __syncthreads();
    float mean = (float)(part[0] / (double)d);
    float scale = 1.0f / sqrtf(mean + eps);
    const int steps = (n4 + VT - 1) / VT;  // the same for every thread, <= NORM_IT
#pragma unroll
    for (int it = 0; it < NORM_IT; it++) {
        if (it >= steps) break;
        const int c = it * VT + g;
        const float4 a = v[it], b = wv[it];
        if (yr && c < n4) xr[c] = a;
        float4 o = make_float4(__fmul_rn(__fmul_rn(a.x, scale), b.x), __fmul_rn(__fmul_rn(a.y, scale), b.y),
                               __fmul_rn(__fmul_rn(a.z, scale), b.z), __fmul_rn(__fmul_rn(a.w, scale), b.w));
        if (c < n4) orow[c] = o;
        if (xq) {
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
                u64 e = r * d + 4 * (u64)c;
                *(u32*)(xq + e) = (u32)(u8)q0 | ((u32)(u8)q1 << 8) | ((u32)(u8)q2 << 16) | ((u32)(u8)q3 << 24);
                if (threadIdx.x % 8 == 0) xm[e / 32] = make_float2(h2f(f2h(dd)), h2f(f2h(dd * (float)sum)));
            }
        }
    }
}

extern "C" __global__ void __cluster_dims__(NORM_NC, 1, 1) rms_norm_cl(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
                                                                       int d, float eps, i8* __restrict__ xq, float2* __restrict__ xm) {
    GDC();
    norm_row_cl<false>((float*)x, nullptr, 1.0f, w, out, d, eps, xq, xm);
}

extern "C" __global__ void __cluster_dims__(NORM_NC, 1, 1) add_rms_norm_cl(float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ w,
                                                                           float* __restrict__ out, int d, float eps, i8* __restrict__ xq,
                                                                           float2* __restrict__ xm) {
    GDC();
    norm_row_cl<false>(x, y, 1.0f, w, out, d, eps, xq, xm);
}

extern "C" __global__ void __cluster_dims__(NORM_NC, 1, 1) add_scaled_rms_norm_cl(float* __restrict__ x, const float* __restrict__ y, float ys,
                                                                                  const float* __restrict__ w, float* __restrict__ out, int d,
                                                                                  float eps, i8* __restrict__ xq, float2* __restrict__ xm) {
    GDC();
    norm_row_cl<true>(x, y, ys, w, out, d, eps, xq, xm);
}
#endif
