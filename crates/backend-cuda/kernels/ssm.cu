// Mamba2 ops: causal depthwise conv1d with carried state, the selective scan, the gated
// grouped RMSNorm (quarrel_core::ssm reference semantics, ggml's operation order).
// Sequences of a batch: seq[4 * s + {0,1,2,3}] = {state slot, first token, tokens, fresh}.

// The CPU backend's numerics (ggml's AVX-512 build): SiLU as ggml_v_silu where ggml vectorizes
// it, libm's expf / logf (correctly rounded, through f64) elsewhere, no contracted products.
__device__ __forceinline__ float silu_libm(float v) { return __fdiv_rn(v, __fadd_rn(1.0f, expf_libm(-v))); }

__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : (float)log((double)__fadd_rn(1.0f, expf_libm(x))); }

// One thread per (sequence, channel): window = carried state (d_conv - 1 values, oldest
// first) then the sequence's inputs; out = silu(sum_i win[t + i] * w[ch, i] + bias[ch]).
extern "C" __global__ void ssm_conv(const float* __restrict__ zx, const float* __restrict__ w, const float* __restrict__ bias,
                                    const u32* __restrict__ seq, float* __restrict__ state, float* __restrict__ out, int n_seq,
                                    int cd, int nc, int dp, int col0) {
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (u64)n_seq * cd) return;
    int s = (int)(g / cd), ch = (int)(g % cd);
    u32 slot = seq[4 * s], t0 = seq[4 * s + 1], nt = seq[4 * s + 2], fresh = seq[4 * s + 3];
    float* st = state + ((u64)slot * cd + ch) * (nc - 1);
    float win[8];  // d_conv <= 8 (checked on the host)
    for (int i = 0; i < nc - 1; i++) win[i] = fresh ? 0.f : st[i];
    const float* wc = w + (u64)ch * nc;
    float b = bias ? bias[ch] : 0.f;
    for (u32 t = 0; t < nt; t++) {
        win[nc - 1] = zx[(u64)(t0 + t) * dp + col0 + ch];
        float acc = 0.f;
        for (int i = 0; i < nc; i++) acc = fmaf(win[i], wc[i], acc);
        float v = __fadd_rn(acc, b);
        // ggml_v_silu on each row's 16-wide vectors, libm on the rest
        out[(u64)(t0 + t) * cd + ch] = ch < (cd & ~15) ? silu_ggml(v) : silu_libm(v);
        for (int i = 0; i < nc - 1; i++) win[i] = win[i + 1];
    }
    for (int i = 0; i < nc - 1; i++) st[i] = win[i];
}

// One warp per (sequence, head, i): the state row s[k], k < d_state, spread over the lanes;
// per token s = s * exp(dt * A) + B * (x * dt), y = s . C + x * D, dt = softplus(raw + bias).
// Non-finite state values are counted in *bad.
extern "C" __global__ void ssm_scan(const float* __restrict__ xbc, const float* __restrict__ zx, const float* __restrict__ A,
                                    const float* __restrict__ D, const float* __restrict__ dtb, const u32* __restrict__ seq,
                                    float* __restrict__ state, float* __restrict__ y, unsigned long long* __restrict__ bad, int n_seq,
                                    int n_head, int hd, int ds, int n_group, int dp, int dt_col) {
    const int lane = threadIdx.x % 32;
    u64 wg = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int d_inner = n_head * hd, cd = d_inner + 2 * n_group * ds, hpg = n_head / n_group;
    if (wg >= (u64)n_seq * d_inner) return;
    int s = (int)(wg / d_inner), hi = (int)(wg % d_inner), h = hi / hd, gr = h / hpg;
    u32 slot = seq[4 * s], t0 = seq[4 * s + 1], nt = seq[4 * s + 2], fresh = seq[4 * s + 3];
    float* st = state + ((u64)slot * d_inner + hi) * ds;
    float sv[8];  // d_state <= 256
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int k = lane + 32 * j;
        sv[j] = (k < ds && !fresh) ? st[k] : 0.f;
    }
    const float a = A[h], dd = D[h], bb = dtb[h];
    unsigned long long nbad = 0;
    for (u32 t = 0; t < nt; t++) {
        const float* row = xbc + (u64)(t0 + t) * cd;
        const float* B = row + d_inner + gr * ds;
        const float* C = row + d_inner + (n_group + gr) * ds;
        float dt = softplus_f(__fadd_rn(zx[(u64)(t0 + t) * dp + dt_col + h], bb));
        float da = expf_libm(__fmul_rn(dt, a));
        float x = row[hi];
        float xdt = __fmul_rn(x, dt);
        // y = s . C in the CPU's order (ggml's AVX-512 build): four 16-lane FMA accumulators over
        // 64-wide steps (lane L: k = 64 i + L into accumulator L, k = 64 i + 32 + L into L + 32),
        // folded as _mm512_reduce_add_ps, then the last ds % 64 values one by one
        const int np = ds & ~63;
        float acc_a = 0.f, acc_b = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int k = lane + 32 * j;
            if (k < ds) {
                float v = __fadd_rn(__fmul_rn(sv[j], da), __fmul_rn(B[k], xdt));
                sv[j] = v;
                nbad += !isfinite(v);
                if (k < np) {
                    if (j % 2 == 0) acc_a = fmaf(v, C[k], acc_a);
                    else acc_b = fmaf(v, C[k], acc_b);
                }
            }
        }
        // x[l] = (acc0 + acc2) + (acc1 + acc3): lanes l < 16 hold acc0, acc2; lanes l + 16 acc1, acc3
        float f = __fadd_rn(acc_a, acc_b);
        f = __fadd_rn(f, __shfl_down_sync(0xffffffffu, f, 16));
        f = __fadd_rn(f, __shfl_down_sync(0xffffffffu, f, 8));
        f = __fadd_rn(f, __shfl_down_sync(0xffffffffu, f, 4));
        f = __fadd_rn(f, __shfl_down_sync(0xffffffffu, f, 2));
        f = __fadd_rn(f, __shfl_down_sync(0xffffffffu, f, 1));
        float sum = f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            for (int l = 0; l < 32; l++) {
                int k = l + 32 * j;
                if (k < np || k >= ds) continue;
                sum = fmaf(__shfl_sync(0xffffffffu, sv[j], l), C[k], sum);
            }
        }
        if (lane == 0) y[(u64)(t0 + t) * d_inner + hi] = __fadd_rn(sum, __fmul_rn(x, dd));
    }
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int k = lane + 32 * j;
        if (k < ds) st[k] = sv[j];
    }
    if (nbad) atomicAdd(bad, nbad);
}

// One block per (token, group): v = silu(z) * y over the group's gs values,
// out = (v * (1 / sqrt(mean(v²) + eps))) * w, the squares (rounded to f32) summed in f64 as the
// CPU backend does (ggml's rms_norm).
extern "C" __global__ void ssm_gated_norm(const float* __restrict__ y, const float* __restrict__ zx, const float* __restrict__ w,
                                          float* __restrict__ out, int d_inner, int n_group, int dp, float eps) {
    __shared__ double part[32];
    const int t = blockIdx.x, g = blockIdx.y, gs = d_inner / n_group;
    const float* yr = y + (u64)t * d_inner + g * gs;
    const float* zr = zx + (u64)t * dp + g * gs;
    double ss = 0.0;
    for (int i = threadIdx.x; i < gs; i += blockDim.x) {
        float v = __fmul_rn(silu_ggml(zr[i]), yr[i]);
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
    const float scale = __fdiv_rn(1.0f, sqrtf(__fadd_rn((float)(part[0] / (double)gs), eps)));
    float* o = out + (u64)t * d_inner + g * gs;
    for (int i = threadIdx.x; i < gs; i += blockDim.x)
        o[i] = __fmul_rn(__fmul_rn(__fmul_rn(silu_ggml(zr[i]), yr[i]), scale), w[g * gs + i]);
}

// Copy `n` floats (state slot copies).
extern "C" __global__ void copy_f32(const float* __restrict__ src, float* __restrict__ dst, u64 n) {
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (g < n) dst[g] = src[g];
}
