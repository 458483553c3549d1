// Mamba2 ops: causal depthwise conv1d with carried state, the selective scan, the gated
// grouped RMSNorm (quarrel_core::ssm reference semantics, ggml's operation order).
// The decode kernels (ssm_conv, ssm_scan, ssm_gated_norm) begin with GDC(): launched with PDL.
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
    GDC();
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

// One token of one state row in the CPU backend's order (ggml's AVX-512 build): lane L holds
// s[k] for k = L + 32 j (sv[j]); s = s * da + B * xdt as two products and an add; y = s . C
// in four 16-lane FMA accumulators over 64-wide steps (lane L: k = 64 i + L into accumulator
// L, k = 64 i + 32 + L into L + 32), folded as _mm512_reduce_add_ps, then the last ds % 64
// values one by one; + x * D. Returns y (every lane); counts non-finite state values.
__device__ __forceinline__ float scan_token(float (&sv)[8], const float* __restrict__ B, const float* __restrict__ C, float da, float xdt,
                                            float x, float dd, int ds, int lane, unsigned long long& nbad) {
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
    float sum = __shfl_sync(0xffffffffu, f, 0);
    // the tail (ds % 64 values): skipped as a whole when there is none (d_state 64, 128, ..):
    // its 256 empty iterations per token would otherwise dominate the scan
    if (np < ds)
#pragma unroll
    for (int j = 0; j < 8; j++) {
        for (int l = 0; l < 32; l++) {
            int k = l + 32 * j;
            if (k < np || k >= ds) continue;
            sum = fmaf(__shfl_sync(0xffffffffu, sv[j], l), C[k], sum);
        }
    }
    return __fadd_rn(sum, __fmul_rn(x, dd));
}

// A state row st[k], k < ds, in scan_token's layout (lane L: k = L + 32 j in sv[j]); zeros for
// a fresh sequence.
__device__ __forceinline__ void load_state(float (&sv)[8], const float* st, int ds, int lane, u32 fresh) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int k = lane + 32 * j;
        sv[j] = (k < ds && !fresh) ? st[k] : 0.f;
    }
}

// And back.
__device__ __forceinline__ void store_state(const float (&sv)[8], float* st, int ds, int lane) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int k = lane + 32 * j;
        if (k < ds) st[k] = sv[j];
    }
}

// One warp per (sequence, head, i): the state row s[k], k < d_state, spread over the lanes;
// per token s = s * exp(dt * A) + B * (x * dt), y = s . C + x * D, dt = softplus(raw + bias).
// Non-finite state values are counted in *bad.
extern "C" __global__ void ssm_scan(const float* __restrict__ xbc, const float* __restrict__ zx, const float* __restrict__ A,
                                    const float* __restrict__ D, const float* __restrict__ dtb, const u32* __restrict__ seq,
                                    float* __restrict__ state, float* __restrict__ y, unsigned long long* __restrict__ bad, int n_seq,
                                    int n_head, int hd, int ds, int n_group, int dp, int dt_col) {
    GDC();
    const int lane = threadIdx.x % 32;
    u64 wg = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int d_inner = n_head * hd, cd = d_inner + 2 * n_group * ds, hpg = n_head / n_group;
    if (wg >= (u64)n_seq * d_inner) return;
    int s = (int)(wg / d_inner), hi = (int)(wg % d_inner), h = hi / hd, gr = h / hpg;
    u32 slot = seq[4 * s], t0 = seq[4 * s + 1], nt = seq[4 * s + 2], fresh = seq[4 * s + 3];
    float* st = state + ((u64)slot * d_inner + hi) * ds;
    float sv[8];  // d_state <= 256
    load_state(sv, st, ds, lane, fresh);
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
        float yv = scan_token(sv, B, C, da, xdt, x, dd, ds, lane, nbad);
        if (lane == 0) y[(u64)(t0 + t) * d_inner + hi] = yv;
    }
    store_state(sv, st, ds, lane);
    if (nbad) atomicAdd(bad, nbad);
}

// A channel's conv state after one token v: (old[1 ..], v), or (0 .., v) for a fresh sequence
// (ssm_conv's window after the token); all loads before the stores (nc <= 8).
__device__ __forceinline__ void shift_state(float* st, int nc, u32 fresh, float v) {
    float w[7];
#pragma unroll
    for (int k = 0; k < 7; k++) w[k] = (k < nc - 2 && !fresh) ? st[k + 1] : 0.f;
#pragma unroll
    for (int k = 0; k < 7; k++)
        if (k < nc - 2) st[k] = w[k];
    st[nc - 2] = v;
}

// ssm_conv and ssm_scan of a decode step (every sequence one token or none) in one launch.
// Blocks as ssm_scan's (8 warps: rows hi0 .. hi0 + 7 of one head); each block first computes
// the conv outputs it reads, its 8 x channels and its group's B and C channels, with ssm_conv's
// arithmetic into shared memory (2 * ds + 8 floats), then scans as ssm_scan (scan_token: the
// same bits). Conv state and output xbc: a block writes its x channels' state and output, the
// first block of a group the group's B / C outputs; the B / C state, which every block of the
// group reads, is shifted by the group's block that finishes last (a counter per state slot and
// group at cnt[slot * n_group + group], reset by it).
extern "C" __global__ void __launch_bounds__(256) ssm_conv_scan(const float* __restrict__ zx, const float* __restrict__ cw,
        const float* __restrict__ cbias, const u32* __restrict__ seq, float* __restrict__ cstate, float* __restrict__ xbc,
        const float* __restrict__ A, const float* __restrict__ D, const float* __restrict__ dtb, float* __restrict__ sstate,
        float* __restrict__ y, unsigned long long* __restrict__ bad, int n_seq, int n_head, int hd, int ds, int n_group, int dp,
        int dt_col, int nc, u32* __restrict__ cnt) {
    // Before the PDL wait, what the previous kernel (the input projection) does not write: the
    // sequence table (uploaded before the step), the recurrent state row, the per-head inputs,
    // and each conv channel's sum over its carried state (the taps before the new input, in
    // ssm_conv's order); the projection zx only after it.
    extern __shared__ float cs_sm[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int d_inner = n_head * hd, cd = d_inner + 2 * n_group * ds, hpg = n_head / n_group;
    const u64 wg0 = (u64)blockIdx.x * 8;
    const int s = (int)(wg0 / d_inner), hi0 = (int)(wg0 % d_inner), h = hi0 / hd, gr = h / hpg;
    const u32 slot = seq[4 * s], t0 = seq[4 * s + 1], nt = seq[4 * s + 2], fresh = seq[4 * s + 3];
    if (nt == 1) {
        const int hi = hi0 + warp;
        float* sst = sstate + ((u64)slot * d_inner + hi) * ds;
        float sv[8];  // d_state <= 256
        load_state(sv, sst, ds, lane, fresh);
        const float a = A[h], dd = D[h], bb = dtb[h];
        // this thread's conv channels i = tid + 256 r (2 ds + 8 <= 768)
        float pacc[3], wlast[3], cb[3];
#pragma unroll
        for (int r = 0; r < 3; r++) {
            const int i = threadIdx.x + r * blockDim.x;
            pacc[r] = wlast[r] = cb[r] = 0.f;
            if (i < 2 * ds + 8) {
                const int ch = i < ds ? d_inner + gr * ds + i : (i < 2 * ds ? d_inner + (n_group + gr) * ds + (i - ds) : hi0 + (i - 2 * ds));
                const float* st = cstate + ((u64)slot * cd + ch) * (nc - 1);
                const float* wc = cw + (u64)ch * nc;
                float acc = 0.f;
                for (int k = 0; k < nc - 1; k++) acc = fmaf(fresh ? 0.f : st[k], wc[k], acc);
                pacc[r] = acc;
                wlast[r] = wc[nc - 1];
                cb[r] = cbias ? cbias[ch] : 0.f;
            }
        }
        GDC();
        const float dtr = zx[(u64)t0 * dp + dt_col + h];
        const float* in = zx + (u64)t0 * dp + d_inner;  // the conv's input columns
#pragma unroll
        for (int r = 0; r < 3; r++) {
            const int i = threadIdx.x + r * blockDim.x;
            if (i < 2 * ds + 8) {
                const int ch = i < ds ? d_inner + gr * ds + i : (i < 2 * ds ? d_inner + (n_group + gr) * ds + (i - ds) : hi0 + (i - 2 * ds));
                const float v = __fadd_rn(fmaf(in[ch], wlast[r], pacc[r]), cb[r]);
                cs_sm[i] = ch < (cd & ~15) ? silu_ggml(v) : silu_libm(v);
            }
        }
        __syncthreads();
        float* out = xbc + (u64)t0 * cd;
        if (threadIdx.x < 8) {
            const int ch = hi0 + threadIdx.x;
            if (nc > 1) shift_state(cstate + ((u64)slot * cd + ch) * (nc - 1), nc, fresh, in[ch]);
            out[ch] = cs_sm[2 * ds + threadIdx.x];
        }
        if (hi0 % (hpg * hd) == 0)
            for (int i = threadIdx.x; i < 2 * ds; i += blockDim.x) out[i < ds ? d_inner + gr * ds + i : d_inner + (n_group + gr) * ds + (i - ds)] = cs_sm[i];
        // the scan of row hi (ssm_scan's arithmetic, one token)
        unsigned long long nbad = 0;
        const float dt = softplus_f(__fadd_rn(dtr, bb));
        const float da = expf_libm(__fmul_rn(dt, a));
        const float x = cs_sm[2 * ds + warp];
        const float yv = scan_token(sv, cs_sm, cs_sm + ds, da, __fmul_rn(x, dt), x, dd, ds, lane, nbad);
        if (lane == 0) y[(u64)t0 * d_inner + hi] = yv;
        store_state(sv, sst, ds, lane);
        if (nbad) atomicAdd(bad, nbad);
    } else {
        GDC();
    }
    // every block of the group has read the group's B / C conv state before it counts itself
    // done; the group's last block shifts it (one channel per thread, its loads before its stores)
    __shared__ u32 last;
    __syncthreads();
    u32* c = cnt + (u64)slot * n_group + gr;
    if (threadIdx.x == 0) last = atomicAdd(c, 1u) == (u32)(hpg * hd / 8 - 1);
    __syncthreads();
    if (!last) return;
    if (threadIdx.x == 0) *c = 0u;  // ready for the next launch
    if (nt != 1 || nc < 2) return;
    __threadfence();
    const float* in = zx + (u64)t0 * dp + d_inner;
    for (int i = threadIdx.x; i < 2 * ds; i += blockDim.x) {
        const int ch = i < ds ? d_inner + gr * ds + i : d_inner + (n_group + gr) * ds + (i - ds);
        float* st = cstate + ((u64)slot * cd + ch) * (nc - 1);
        shift_state(st, nc, fresh, in[ch]);
    }
}

// One block per (token, group): v = silu(z) * y over the group's gs values,
// out = (v * (1 / sqrt(mean(v²) + eps))) * w (xq/xm non-null: also as Q8, quantize_q8's bits,
// for the output projection; needs gs a multiple of 32), the squares (rounded to f32) summed in f64 as the
// CPU backend does (ggml's rms_norm).
extern "C" __global__ void ssm_gated_norm(const float* __restrict__ y, const float* __restrict__ zx, const float* __restrict__ w,
                                          float* __restrict__ out, int d_inner, int n_group, int dp, float eps,
                                          i8* __restrict__ xq, float2* __restrict__ xm) {
    GDC();
    __shared__ double part[32];
    const int t = blockIdx.x, g = blockIdx.y, gs = d_inner / n_group;
    const float* yr = y + (u64)t * d_inner + g * gs;
    const float* zr = zx + (u64)t * dp + g * gs;
    double ss = 0.0;
    for (int i = threadIdx.x; i < gs; i += blockDim.x) {
        float v = __fmul_rn(silu_ggml(zr[i]), yr[i]);
        ss += (double)__fmul_rn(v, v);
    }
    const float scale = __fdiv_rn(1.0f, sqrtf(__fadd_rn((float)(block_sum_d(ss, part) / (double)gs), eps)));
    float* o = out + (u64)t * d_inner + g * gs;
    for (int i = threadIdx.x; i < gs; i += blockDim.x) {
        const float v = __fmul_rn(__fmul_rn(__fmul_rn(silu_ggml(zr[i]), yr[i]), scale), w[g * gs + i]);
        o[i] = v;
        // a warp holds 32 consecutive values of one Q8 block (gs and blockDim multiples of 32)
        if (xq) q8_store(v, xq, xm, ((u64)t * d_inner + (u64)g * gs + i) / 32);
    }
}

// Copy `n` floats (state slot copies).
extern "C" __global__ void copy_f32(const float* __restrict__ src, float* __restrict__ dst, u64 n) {
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (g < n) dst[g] = src[g];
}

// ssm_conv for prefill steps: one thread per (token: blockIdx.x, channel), every token at once
// (the window of token t: the inputs t - nc + 1 .. t, before the sequence's first token its
// carried state), the same sum in the same order as ssm_conv. tokseq[token] = its sequence (or
// ~0u: none). The carried state is left alone: ssm_conv_state updates it afterwards.
extern "C" __global__ void ssm_conv_par(const float* __restrict__ zx, const float* __restrict__ w, const float* __restrict__ bias,
                                        const u32* __restrict__ seq, const u32* __restrict__ tokseq, const float* __restrict__ state,
                                        float* __restrict__ out, int cd, int nc, int dp, int col0) {
    const int ch = blockIdx.y * blockDim.x + threadIdx.x;
    const u32 g = blockIdx.x, s = tokseq[g];
    if (ch >= cd || s == ~0u) return;
    const u32 slot = seq[4 * s], t0 = seq[4 * s + 1], fresh = seq[4 * s + 3];
    const int t = (int)(g - t0);
    const float* st = state + ((u64)slot * cd + ch) * (nc - 1);
    const float* wc = w + (u64)ch * nc;
    float acc = 0.f;
    for (int i = 0; i < nc; i++) {
        const int p = t - (nc - 1) + i;
        const float v = p >= 0 ? zx[(u64)(t0 + p) * dp + col0 + ch] : (fresh ? 0.f : st[p + nc - 1]);
        acc = fmaf(v, wc[i], acc);
    }
    const float v = __fadd_rn(acc, bias ? bias[ch] : 0.f);
    // as ssm_conv: ggml_v_silu on each row's 16-wide vectors, libm on the rest
    out[(u64)g * cd + ch] = ch < (cd & ~15) ? silu_ggml(v) : silu_libm(v);
}

// The carried conv state after a step: per (sequence, channel) the last nc - 1 inputs of
// (old state, the sequence's tokens), as ssm_conv leaves it.
extern "C" __global__ void ssm_conv_state(const float* __restrict__ zx, const u32* __restrict__ seq, float* __restrict__ state, int n_seq,
                                          int cd, int nc, int dp, int col0) {
    u64 gi = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (gi >= (u64)n_seq * cd) return;
    const int s = (int)(gi / cd), ch = (int)(gi % cd);
    const u32 slot = seq[4 * s], t0 = seq[4 * s + 1], nt = seq[4 * s + 2], fresh = seq[4 * s + 3];
    float* st = state + ((u64)slot * cd + ch) * (nc - 1);
    float win[8];
    for (int i = 0; i < nc - 1; i++) {
        const int p = (int)nt - (nc - 1) + i;
        win[i] = p >= 0 ? zx[(u64)(t0 + p) * dp + col0 + ch] : (fresh ? 0.f : st[p + nc - 1]);
    }
    for (int i = 0; i < nc - 1; i++) st[i] = win[i];
}

// ssm_scan for prefill steps: a block of 8 warps takes 8 consecutive rows (hi0 .. hi0 + 7) of
// one head of one sequence; chunks of SCAN_T tokens of B, C, x, dt and exp(dt·A) are staged in
// shared memory by the whole block (coalesced, all loads in flight), then each warp runs its
// row over the chunk as ssm_scan does (the same state layout over the lanes, the same
// scan_token: the same bits). Needs hd % 8 == 0 and ds % 4 == 0. Dynamic shared memory:
// SCAN_T · (2 · ds + 8 + 2) floats.
#define SCAN_T 32
extern "C" __global__ void __launch_bounds__(256) ssm_scan_chunk(const float* __restrict__ xbc, const float* __restrict__ zx,
        const float* __restrict__ A, const float* __restrict__ D, const float* __restrict__ dtb, const u32* __restrict__ seq,
        float* __restrict__ state, float* __restrict__ y, unsigned long long* __restrict__ bad, int n_head, int hd, int ds,
        int n_group, int dp, int dt_col) {
    extern __shared__ float4 scan_sm4[];
    float* sB = (float*)scan_sm4;            // [SCAN_T][ds]
    float* sC = sB + SCAN_T * ds;       // [SCAN_T][ds]
    float* sx = sC + SCAN_T * ds;       // [SCAN_T][8]
    float* sdt = sx + SCAN_T * 8;       // [SCAN_T]
    float* sda = sdt + SCAN_T;          // [SCAN_T]
    const int tid = threadIdx.x, lane = tid % 32, wp = tid / 32;
    const int d_inner = n_head * hd, cd = d_inner + 2 * n_group * ds, hpg = n_head / n_group;
    const int rows8 = d_inner / 8;
    const int s = blockIdx.x / rows8, hi0 = (blockIdx.x % rows8) * 8, hi = hi0 + wp, h = hi0 / hd, gr = h / hpg;
    const u32 slot = seq[4 * s], t0 = seq[4 * s + 1], nt = seq[4 * s + 2], fresh = seq[4 * s + 3];
    float* st = state + ((u64)slot * d_inner + hi) * ds;
    float sv[8];
    load_state(sv, st, ds, lane, fresh);
    const float a = A[h], dd = D[h], bb = dtb[h];
    unsigned long long nbad = 0;
    for (u32 c0 = 0; c0 < nt; c0 += SCAN_T) {
        const int n = min((int)(nt - c0), SCAN_T);
        __syncthreads();  // the last chunk's readers are done
        // B and C rows: warp wp takes tokens wp, wp + 8, .., its lanes the float4s of a row
        // (ds % 4 == 0 and cd % 4 == 0, checked on the host: 16-byte aligned rows)
        const int ds4 = ds / 4;
#pragma unroll 4
        for (int t = wp; t < n; t += 8) {
            const float4* row = (const float4*)(xbc + (u64)(t0 + c0 + t) * cd + d_inner);
            float4* b4 = (float4*)(sB + t * ds);
            float4* c4 = (float4*)(sC + t * ds);
            for (int i = lane; i < ds4; i += 32) {
                b4[i] = row[gr * ds4 + i];
                c4[i] = row[(n_group + gr) * ds4 + i];
            }
        }
        if (tid < n * 8) sx[tid] = xbc[(u64)(t0 + c0 + tid / 8) * cd + hi0 + tid % 8];
        if (tid < n) {
            const float dt = softplus_f(__fadd_rn(zx[(u64)(t0 + c0 + tid) * dp + dt_col + h], bb));
            sdt[tid] = dt;
            sda[tid] = expf_libm(__fmul_rn(dt, a));
        }
        __syncthreads();
#pragma unroll 4
        for (int t = 0; t < n; t++) {
            const float* B = sB + t * ds;
            const float* C = sC + t * ds;
            const float dt = sdt[t], da = sda[t];
            const float x = sx[t * 8 + wp];
            const float xdt = __fmul_rn(x, dt);
            const float yv = scan_token(sv, B, C, da, xdt, x, dd, ds, lane, nbad);
            if (lane == 0) y[(u64)(t0 + c0 + t) * d_inner + hi] = yv;
        }
    }
    store_state(sv, st, ds, lane);
    if (nbad) atomicAdd(bad, nbad);
}

// ssm_scan_chunk_<DS>: ssm_scan_chunk with the state size DS known at compile time (64, 128
// or 256) and R = 2 rows of one head per warp (4 warps, 8 rows per block, as above): the same
// arithmetic as scan_token, term for term (the same bits: tests/ssm.rs), without its run-time
// bounds and tail; the two rows' output folds share their shuffles, the rows of a warp share
// each shared-memory read of B and C, and non-finite state values are counted from the final
// state (a recount only where it is non-finite). ssm_scan_chunk is bound by issuing its
// instructions (~200 per token and row at DS = 128); this kernel issues about a sixth of them.
// Shared memory holds B and C permuted so that lane l reads its values (k = l + 32 j,
// j < DS / 32) as float4 (float2 at DS = 64): element (j, l) at (j / G) 32 G + l G + j % G,
// G = min(DS / 32, 4). Dynamic shared memory: SCAN_T · (2 · DS + 10) floats, as above.
template <int DS>
struct ScanLayout {
    static constexpr int J = DS / 32, G = J < 4 ? J : 4;
    static __device__ __forceinline__ int at(int j, int l) { return (j / G) * 32 * G + l * G + j % G; }
};

template <int DS>
__device__ __forceinline__ void scan_chunk_ds(const float* __restrict__ xbc, const float* __restrict__ zx, const float* __restrict__ A,
                                              const float* __restrict__ D, const float* __restrict__ dtb, const u32* __restrict__ seq,
                                              float* __restrict__ state, float* __restrict__ y, unsigned long long* __restrict__ bad,
                                              int n_head, int hd, int n_group, int dp, int dt_col) {
    using L = ScanLayout<DS>;
    constexpr int R = 2;  // rows per warp: the output fold takes them in its two half-warps
    constexpr int J = L::J, G = L::G, W = 8 / R;
    // B, C [SCAN_T][DS] (permuted), x [SCAN_T][8], (dt, exp(dt A)) [SCAN_T]
    extern __shared__ float4 scan_smd[];
    float* sB = (float*)scan_smd;
    float* sC = sB + SCAN_T * DS;
    float* sx = sC + SCAN_T * DS;
    float2* sdd = (float2*)(sx + SCAN_T * 8);
    const int tid = threadIdx.x, lane = tid % 32, wp = tid / 32;
    const int d_inner = n_head * hd, cd = d_inner + 2 * n_group * DS, hpg = n_head / n_group;
    const int rows8 = d_inner / 8;
    const int s = blockIdx.x / rows8, hi0 = (blockIdx.x % rows8) * 8, h = hi0 / hd, gr = h / hpg;
    const u32 slot = seq[4 * s], t0 = seq[4 * s + 1], nt = seq[4 * s + 2], fresh = seq[4 * s + 3];
    const float a = A[h], dd = D[h], bb = dtb[h];
    // stage chunk c0 (every thread; a warp per token of B and C). Loads are issued in groups
    // before their stores (the raw dt and x first, then B and C of TG tokens a warp), so that a
    // chunk waits for about two load latencies, not one per token.
    constexpr int TG = 4;
    auto stage = [&](u32 c0) {
        const int n = min((int)(nt - c0), SCAN_T);
        float raw = 0.f, xv[2];
        if (tid < n) raw = zx[(u64)(t0 + c0 + tid) * dp + dt_col + h];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int i = tid + k * W * 32;
            xv[k] = i < n * 8 ? xbc[(u64)(t0 + c0 + i / 8) * cd + hi0 + i % 8] : 0.f;
        }
        for (int t1 = wp * TG; t1 < n; t1 += W * TG) {
            float b[TG][J], c[TG][J];
#pragma unroll
            for (int u = 0; u < TG; u++) {
                const int t = min(t1 + u, n - 1);  // past the end: a repeat of the last token
                const float* row = xbc + (u64)(t0 + c0 + t) * cd + d_inner;
#pragma unroll
                for (int j = 0; j < J; j++) {
                    b[u][j] = row[gr * DS + lane + 32 * j];
                    c[u][j] = row[(n_group + gr) * DS + lane + 32 * j];
                }
            }
#pragma unroll
            for (int u = 0; u < TG; u++) {
                const int t = t1 + u;
                if (t >= n) break;
#pragma unroll
                for (int g = 0; g < J / G; g++) {
                    float* pb = sB + t * DS + L::at(g * G, lane);
                    float* pc = sC + t * DS + L::at(g * G, lane);
                    if constexpr (G == 4) {
                        *(float4*)pb = make_float4(b[u][4 * g], b[u][4 * g + 1], b[u][4 * g + 2], b[u][4 * g + 3]);
                        *(float4*)pc = make_float4(c[u][4 * g], c[u][4 * g + 1], c[u][4 * g + 2], c[u][4 * g + 3]);
                    } else {
                        *(float2*)pb = make_float2(b[u][2 * g], b[u][2 * g + 1]);
                        *(float2*)pc = make_float2(c[u][2 * g], c[u][2 * g + 1]);
                    }
                }
            }
        }
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int i = tid + k * W * 32;
            if (i < n * 8) sx[i] = xv[k];
        }
        if (tid < n) {
            const float dt = softplus_f(__fadd_rn(raw, bb));
            sdd[tid] = make_float2(dt, expf_libm(__fmul_rn(dt, a)));
        }
    };
    // sv0: the state before this step (the rare recount of non-finite values starts there)
    float sv[R][J], sv0[R][J];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float* st = state + ((u64)slot * d_inner + hi0 + wp * R + r) * DS;
#pragma unroll
        for (int j = 0; j < J; j++) sv0[r][j] = sv[r][j] = fresh ? 0.f : st[lane + 32 * j];
    }
    const bool upper = lane >= 16;
    for (u32 c0 = 0; c0 < nt; c0 += SCAN_T) {
        const int n = min((int)(nt - c0), SCAN_T);
        __syncthreads();  // the last chunk's readers are done
        stage(c0);
        __syncthreads();
#pragma unroll 4
        for (int t = 0; t < n; t++) {
            float b[J], c[J];
#pragma unroll
            for (int g = 0; g < J / G; g++) {
                const float* pb = sB + t * DS + L::at(g * G, lane);
                const float* pc = sC + t * DS + L::at(g * G, lane);
                if constexpr (G == 4) {
                    const float4 vb = *(const float4*)pb, vc = *(const float4*)pc;
                    b[4 * g] = vb.x, b[4 * g + 1] = vb.y, b[4 * g + 2] = vb.z, b[4 * g + 3] = vb.w;
                    c[4 * g] = vc.x, c[4 * g + 1] = vc.y, c[4 * g + 2] = vc.z, c[4 * g + 3] = vc.w;
                } else {
                    const float2 vb = *(const float2*)pb, vc = *(const float2*)pc;
                    b[2 * g] = vb.x, b[2 * g + 1] = vb.y;
                    c[2 * g] = vc.x, c[2 * g + 1] = vc.y;
                }
            }
            const float2 dta = sdd[t];
            float f[R], x[R];
#pragma unroll
            for (int r = 0; r < R; r++) {
                x[r] = sx[t * 8 + wp * R + r];
                const float xdt = __fmul_rn(x[r], dta.x);
                // scan_token's terms: s = s * da + B * xdt; accumulators over even / odd j
                float acc_a = 0.f, acc_b = 0.f;
#pragma unroll
                for (int j = 0; j < J; j++) {
                    const float v = __fadd_rn(__fmul_rn(sv[r][j], dta.y), __fmul_rn(b[j], xdt));
                    sv[r][j] = v;
                    if (j % 2 == 0) acc_a = fmaf(v, c[j], acc_a);
                    else acc_b = fmaf(v, c[j], acc_b);
                }
                f[r] = __fadd_rn(acc_a, acc_b);
            }
            // scan_token's fold (lane l + lane l + 16, then + 8, 4, 2, 1) of both rows at once:
            // the first step swaps halves, so that lanes 0-15 fold row 0 and lanes 16-31 row 1
            // (the same pairs summed in the same order: the same bits); lanes 0 and 16 end with
            // the sums
            float g = __fadd_rn(upper ? f[1] : f[0], __shfl_xor_sync(0xffffffffu, upper ? f[0] : f[1], 16));
            g = __fadd_rn(g, __shfl_down_sync(0xffffffffu, g, 8));
            g = __fadd_rn(g, __shfl_down_sync(0xffffffffu, g, 4));
            g = __fadd_rn(g, __shfl_down_sync(0xffffffffu, g, 2));
            g = __fadd_rn(g, __shfl_down_sync(0xffffffffu, g, 1));
            if ((lane & 15) == 0) y[(u64)(t0 + c0 + t) * d_inner + hi0 + wp * R + upper] = __fadd_rn(g, __fmul_rn(upper ? x[1] : x[0], dd));
        }
    }
    u32 nbad = 0;
#pragma unroll
    for (int r = 0; r < R; r++) {
        float* st = state + ((u64)slot * d_inner + hi0 + wp * R + r) * DS;
        bool nonfinite = false;
#pragma unroll
        for (int j = 0; j < J; j++) {
            st[lane + 32 * j] = sv[r][j];
            nonfinite |= !isfinite(sv[r][j]);
        }
        // Non-finite values are absorbing (NaN and inf stay non-finite through s * da + B * xdt),
        // so a row whose final state is finite never held one; a row that ends non-finite is
        // scanned again from sv0 (from global memory; rare) to count them per token as
        // scan_token does.
        if (__any_sync(0xffffffffu, nonfinite)) {
            const int hi = hi0 + wp * R + r;
            for (u32 t = 0; t < nt; t++) {
                const float* row = xbc + (u64)(t0 + t) * cd;
                const float dt = softplus_f(__fadd_rn(zx[(u64)(t0 + t) * dp + dt_col + h], bb));
                const float da = expf_libm(__fmul_rn(dt, a));
                const float xdt = __fmul_rn(row[hi], dt);
#pragma unroll
                for (int j = 0; j < J; j++) {
                    const float v = __fadd_rn(__fmul_rn(sv0[r][j], da), __fmul_rn(row[d_inner + gr * DS + lane + 32 * j], xdt));
                    sv0[r][j] = v;
                    nbad += !isfinite(v);
                }
            }
        }
    }
    if (nbad) atomicAdd(bad, (unsigned long long)nbad);
}

#define SCAN_CHUNK_DS(DS)                                                                                                            \
    extern "C" __global__ void __launch_bounds__(128) ssm_scan_chunk_##DS(                                                           \
        const float* __restrict__ xbc, const float* __restrict__ zx, const float* __restrict__ A, const float* __restrict__ D,        \
        const float* __restrict__ dtb, const u32* __restrict__ seq, float* __restrict__ state, float* __restrict__ y,                 \
        unsigned long long* __restrict__ bad, int n_head, int hd, int ds, int n_group, int dp, int dt_col) {                          \
        scan_chunk_ds<DS>(xbc, zx, A, D, dtb, seq, state, y, bad, n_head, hd, n_group, dp, dt_col);                                \
    }
SCAN_CHUNK_DS(64)
SCAN_CHUNK_DS(128)
SCAN_CHUNK_DS(256)
