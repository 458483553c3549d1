// A single-token decode step's RMSNorm and the MoE router after it in ONE block
// (`norm_router_f32`): the norm of the row exactly as the norm kernels compute it (the same
// norm_row_v4 code, launched with the block size the norm kernel would get, so the same
// bits; the residual add and a held combine before it included, `mode`), then the router
// logits = out · Wᵀ with gemv_f32_1's per-row arithmetic (the same warps per row `wpr`, each
// warp's lanes over the same columns, the same reductions: the same bits), then warp 0 routes
// (route_warp). Saves the router launch's wait on the norm's and the last-block counter.
// mode: 0 rms_norm, 1 add_rms_norm, 2 add_scaled_rms_norm, 3 comb_add_rms_norm,
// 4 comb_add_scaled_rms_norm (y, ys, cy, cw, cn, fresh as those kernels take them).
// Dynamic shared memory: 2 * n_expert floats (the routing). blockDim >= 32 * wpr.
extern "C" __global__ void norm_router_f32(float* __restrict__ x, float* __restrict__ y, float ys, const float* __restrict__ cy,
                                           const float* __restrict__ cw, int cn, int fresh, int mode, const float* __restrict__ nw,
                                           float* __restrict__ out, int d, float eps, i8* __restrict__ xq, float2* __restrict__ xm,
                                           const u8* __restrict__ W, float* __restrict__ logits, int n_expert, int wpr,
                                           const float* __restrict__ bias, u32* __restrict__ eids, float* __restrict__ wts,
                                           unsigned long long* __restrict__ counts, int n_used, int sigmoid, int norm, float scale) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    const u64 row_bytes = (u64)d * 4;
    for (int r = threadIdx.x; r < n_expert; r += blockDim.x) prefetch_l2(W + (u64)r * row_bytes, row_bytes);
    GDC();
    const Comb cb{cy, cw, cn, fresh};
    switch (mode) {
        case 0: norm_row_v4<false>(x, nullptr, 1.0f, nw, out, d, eps, xq, xm); break;
        case 1: norm_row_v4<false>(x, y, 1.0f, nw, out, d, eps, xq, xm); break;
        case 2: norm_row_v4<true>(x, y, ys, nw, out, d, eps, xq, xm); break;
        case 3: norm_row_v4<false, true>(x, y, 1.0f, nw, out, d, eps, xq, xm, cb); break;
        default: norm_row_v4<true, true>(x, y, ys, nw, out, d, eps, xq, xm, cb); break;
    }
    __syncthreads();  // the normed row (global memory) visible to the whole block
    // the logits: row groups of wpr warps, GEMV_ROWS rows each, as gemv_f<WT_F32, 1>
    __shared__ float red[32][GEMV_ROWS];
    const int groups = n_warps / wpr, group = warp / wpr, sub = warp % wpr;
    const int C = d / 8;
    for (int pass = 0; pass * groups * GEMV_ROWS < n_expert; pass++) {
        const int row0 = (pass * groups + group) * GEMV_ROWS;
        float acc[GEMV_ROWS][1];
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) acc[r][0] = 0.f;
        if (group < groups && row0 < n_expert) {
#pragma unroll 2
            for (int c = lane + 32 * sub; c < C; c += 32 * wpr) {
                float xv[8];
                const float4* xp = (const float4*)(out + c * 8);
                float4 a = xp[0], b = xp[1];
                xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w;
                xv[4] = b.x; xv[5] = b.y; xv[6] = b.z; xv[7] = b.w;
#pragma unroll
                for (int r = 0; r < GEMV_ROWS; r++) {
                    int row = min(row0 + r, n_expert - 1);
                    float w[8];
                    load8<WT_F32>(W, (u64)row * d + c * 8, w);
#pragma unroll
                    for (int i = 0; i < 8; i++) acc[r][0] += w[i] * xv[i];
                }
            }
        }
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) {
            float v = warp_sum(acc[r][0]);
            if (lane == 0) red[warp][r] = v;
        }
        __syncthreads();
        if (group < groups && sub == 0 && lane < GEMV_ROWS && row0 + lane < n_expert) {
            float s = 0.f;
            for (int i = 0; i < wpr; i++) s += red[warp + i][lane];
            logits[row0 + lane] = s;
        }
        __syncthreads();
    }
    if (warp == 0) {
        extern __shared__ float route_sm[];
        route_warp(logits, bias, route_sm, route_sm + n_expert, eids, wts, counts, n_expert, n_used, sigmoid, norm, scale);
    }
}
