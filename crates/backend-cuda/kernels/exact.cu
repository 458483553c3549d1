// Quantized GEMV in the CPU backend's float order (`gemvo_*`): every output has the CPU's bits.
// The CPU's orders (which are llama.cpp's x86 build's):
// - Q4_1, Q8_0: ggml_vec_dot_{q4_1_q8_1, q8_0_q8_0}'s AVX2 path (crates/backend-cpu/src/simd/
//   x86/ggml_order.rs): per output one 8-lane accumulator, lane l adding d_w * d_a * (the exact
//   integer dot of the block's elements 4l..4l+3) with an FMA block after block, then ggml's
//   hsum_float_8, plus Q4_1's summs = fma(m_w, s_a, summs);
// - Q4_0: llama.cpp's repacked (block_q4_0x8) order (crates/backend-cpu/src/simd/repack.rs):
//   one accumulator, acc = fma(float(the block's exact integer dot), d_w * d_a, acc).
// The order only binds the short float chain: the integer sums are exact in any order. So the
// bytes move as in a fast GEMV: R rows a warp (Gemvo::R), lane j loading unit k0 + j of each row
// for each step of 32 units (16-byte loads, UNR steps in flight before any arithmetic), the dp4a
// sums computed in parallel, then per step the float terms go through shared memory to the
// lanes that run the chains in order (Q4_0: lane r NT + t folds row r, token t; Q4_1 / Q8_0:
// lane (r NT + t) 8 + l folds ggml lane l of row r, token t). NT tokens share each weight read.

#define GEMVO_WARPS 4

// A unit's bytes as loaded (payload a [, b for Q8_0], meta m), decoded only when used.
struct RawUnit {
    uint4 a, b;
    u32 m;
};

template <int QT>
__device__ __forceinline__ u32 gemvo_pb() { return QT == QT_Q8_0 ? 32 : 16; }
template <int QT>
__device__ __forceinline__ u32 gemvo_mb() { return QT == QT_Q4_1 ? 4 : 2; }

template <int QT>
__device__ __forceinline__ RawUnit raw_unit(const u8* __restrict__ P, const u8* __restrict__ M, u64 g) {
    RawUnit r;
    if (QT == QT_Q8_0) {
        const uint4* p = (const uint4*)(P + g * 32);
        r.a = p[0];
        r.b = p[1];
    } else {
        r.a = *(const uint4*)(P + g * 16);
        r.b = make_uint4(0, 0, 0, 0);
    }
    r.m = QT == QT_Q4_1 ? ((const u32*)M)[g] : (u32)((const u16*)M)[g];
    return r;
}

// q[l]: the unit's values 4l..4l+3 as signed bytes (Q4_0: nibble - 8; Q4_1: nibble; Q8_0: int8).
template <int QT>
__device__ __forceinline__ void raw_q(const RawUnit& r, int* q) {
    if (QT == QT_Q8_0) {
        q[0] = r.a.x; q[1] = r.a.y; q[2] = r.a.z; q[3] = r.a.w;
        q[4] = r.b.x; q[5] = r.b.y; q[6] = r.b.z; q[7] = r.b.w;
    } else {
        nibbles(r.a, q, QT == QT_Q4_0 ? 8 : 0);
    }
}

// Rows per warp (the chains of R rows run side by side on R * NT lanes, and the activations
// each lane loads serve R rows) and steps of 32 units loaded before any arithmetic.
template <int QT, int NT>
struct Gemvo {
    // Q4_1 / Q8_0 with 8 tokens: one row (the lane dots of two rows would not fit 48 KB)
    static constexpr int R = (QT != QT_Q4_0 && NT == 8) ? 1 : 2;
    static constexpr int UNR = (NT >= 4 || QT == QT_Q8_0) ? 2 : 4;
    // shared floats per warp: Q4_0 (c, d) pairs [R][NT][32]; Q4_1 / Q8_0 the lane dots
    // [R][NT][8][36] (rows padded for conflict-free 16-byte reads), d [R][NT][32], s [NT][32], m [R][32]
    static constexpr int DOTS = R * NT * 8 * 36;
    static constexpr int D = DOTS, S = D + R * NT * 32, MW = S + NT * 32;
    static constexpr int WORDS = QT == QT_Q4_0 ? R * NT * 64 : MW + R * 32;
    // chains: Q4_0 one per (row, token); Q4_1 / Q8_0 8 per (row, token), in passes of 32 lanes
    static constexpr int CHAINS = QT == QT_Q4_0 ? R * NT : R * NT * 8;
    static constexpr int PASSES = (CHAINS + 31) / 32;
};

// Steps k0 / 32 .. k0 / 32 + UNR - 1 of R rows (row offsets rb): lane j loads unit k0 + 32 s + j.
template <int QT, int UNR, int R>
__device__ __forceinline__ void gemvo_load(RawUnit (&raw)[UNR][R], const u8* __restrict__ P, const u8* __restrict__ M, const u64 (&rb)[R],
                                           int k0, int U) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int s = 0; s < UNR; s++) {
        const int k = k0 + 32 * s + lane;
#pragma unroll
        for (int r = 0; r < R; r++)
            if (k < U) raw[s][r] = raw_unit<QT>(P, M, rb[r] + k);
    }
}

// Rows row0 .. row0 + R - 1, then row0 + rs .., while below n_out (this warp's), of
// out[t * n_out + row] = W[row] . x[t], t < NT, in the CPU's order: one loop over (rows, batch of
// steps), the next batch loaded once this one is summed (its registers free again). Rows past
// n_out re-read the last row (results dropped).
template <int QT, int NT>
__device__ __forceinline__ void gemvo_rows(const u8* __restrict__ P, const u8* __restrict__ M, const i8* __restrict__ xq,
                                           const float2* __restrict__ xm, float* __restrict__ out, int U, int n_out, int row0,
                                           int rs, float* __restrict__ sm) {
    typedef Gemvo<QT, NT> G;
    constexpr int R = G::R, UNR = G::UNR;
    const int lane = threadIdx.x % 32;
    float acc[G::PASSES], summs[G::PASSES];
#pragma unroll
    for (int h = 0; h < G::PASSES; h++) acc[h] = summs[h] = 0.f;
    u64 rb[R];
#pragma unroll
    for (int r = 0; r < R; r++) rb[r] = (u64)min(row0 + r, n_out - 1) * U;
    RawUnit raw[UNR][R];
    gemvo_load<QT, UNR, R>(raw, P, M, rb, 0, U);
    int k0 = 0;
    while (true) {
        // the next batch: the rest of these rows, else the first of the next rows (warp-uniform)
        int kn = k0 + 32 * UNR, rn = row0;
        if (kn >= U) {
            kn = 0;
            rn = row0 + rs;
        }
        const bool more = rn < n_out;
        if (more && rn != row0) {
#pragma unroll
            for (int r = 0; r < R; r++) rb[r] = (u64)min(rn + r, n_out - 1) * U;
        }
#pragma unroll
        for (int s = 0; s < UNR; s++) {
            const int kb = k0 + 32 * s;
            if (kb >= U) break;  // warp-uniform
            const int k = kb + lane, n = min(32, U - kb);
            if (k < U) {
                int q[R][8];
                float ws[R];
#pragma unroll
                for (int r = 0; r < R; r++) {
                    raw_q<QT>(raw[s][r], q[r]);
                    ws[r] = h2f((u16)(raw[s][r].m & 0xffff));
                    if (QT == QT_Q4_1) sm[G::MW + r * 32 + lane] = h2f((u16)(raw[s][r].m >> 16));
                }
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    const int4* xp = (const int4*)(xq + ((u64)t * U + k) * 32);
                    const int4 xa = xp[0], xb = xp[1];
                    const float2 xs = xm[(u64)t * U + k];
                    if (QT != QT_Q4_0) sm[G::S + t * 32 + lane] = xs.y;
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        const float d = __fmul_rn(ws[r], xs.x);
                        const int* w = q[r];
                        if (QT == QT_Q4_0) {
                            int is = dp4a(w[3], xa.w, dp4a(w[2], xa.z, dp4a(w[1], xa.y, dp4a(w[0], xa.x, 0))));
                            is = dp4a(w[7], xb.w, dp4a(w[6], xb.z, dp4a(w[5], xb.y, dp4a(w[4], xb.x, is))));
                            ((float2*)sm)[(r * NT + t) * 32 + lane] = make_float2((float)is, d);
                        } else {
                            float* dots = sm + (r * NT + t) * 8 * 36 + lane;
                            dots[0 * 36] = (float)dp4a(w[0], xa.x, 0);
                            dots[1 * 36] = (float)dp4a(w[1], xa.y, 0);
                            dots[2 * 36] = (float)dp4a(w[2], xa.z, 0);
                            dots[3 * 36] = (float)dp4a(w[3], xa.w, 0);
                            dots[4 * 36] = (float)dp4a(w[4], xb.x, 0);
                            dots[5 * 36] = (float)dp4a(w[5], xb.y, 0);
                            dots[6 * 36] = (float)dp4a(w[6], xb.z, 0);
                            dots[7 * 36] = (float)dp4a(w[7], xb.w, 0);
                            sm[G::D + (r * NT + t) * 32 + lane] = d;
                        }
                    }
                }
            }
            __syncwarp();
            if (QT == QT_Q4_0) {
                if (lane < R * NT) {
                    const float* c = sm + lane * 64;  // chain (row, token) = lane
                    if (n == 32) {
#pragma unroll
                        for (int i = 0; i < 16; i++) {
                            const float4 v = ((const float4*)c)[i];
                            acc[0] = __fmaf_rn(v.x, v.y, acc[0]);
                            acc[0] = __fmaf_rn(v.z, v.w, acc[0]);
                        }
                    } else {
                        for (int i = 0; i < n; i++) acc[0] = __fmaf_rn(c[2 * i], c[2 * i + 1], acc[0]);
                    }
                }
            } else {
#pragma unroll
                for (int h = 0; h < G::PASSES; h++) {
                    const int ch = lane + 32 * h;  // chain: row ch / (8 NT), token ch / 8 % NT, ggml lane ch % 8
                    if (ch >= G::CHAINS) break;    // lanes 16.. when there are 16 chains
                    const int rt = ch / 8, t = rt % NT, r = rt / NT;
                    const float* dr = sm + ch * 36;
                    const float* dd = sm + G::D + rt * 32;
                    const float* ss = sm + G::S + t * 32;
                    const float* mm = sm + G::MW + r * 32;
                    if (n == 32) {
#pragma unroll
                        for (int i = 0; i < 8; i++) {
                            const float4 a = ((const float4*)dr)[i], d = ((const float4*)dd)[i];
                            acc[h] = __fmaf_rn(d.x, a.x, acc[h]);
                            acc[h] = __fmaf_rn(d.y, a.y, acc[h]);
                            acc[h] = __fmaf_rn(d.z, a.z, acc[h]);
                            acc[h] = __fmaf_rn(d.w, a.w, acc[h]);
                            if (QT == QT_Q4_1) {
                                const float4 m4 = ((const float4*)mm)[i], s4 = ((const float4*)ss)[i];
                                summs[h] = __fmaf_rn(m4.x, s4.x, summs[h]);
                                summs[h] = __fmaf_rn(m4.y, s4.y, summs[h]);
                                summs[h] = __fmaf_rn(m4.z, s4.z, summs[h]);
                                summs[h] = __fmaf_rn(m4.w, s4.w, summs[h]);
                            }
                        }
                    } else {
                        for (int i = 0; i < n; i++) {
                            acc[h] = __fmaf_rn(dd[i], dr[i], acc[h]);
                            if (QT == QT_Q4_1) summs[h] = __fmaf_rn(mm[i], ss[i], summs[h]);
                        }
                    }
                }
            }
            __syncwarp();
        }
        if (kn == 0) {
            // rows done: write them, start the next
            if (QT == QT_Q4_0) {
                const int r = lane / NT, t = lane % NT;
                if (lane < R * NT && row0 + r < n_out) out[(u64)t * n_out + row0 + r] = acc[0];
            } else {
#pragma unroll
                for (int h = 0; h < G::PASSES; h++) {
                    // hsum_float_8: (a0 + a4) + (a2 + a6) + ((a1 + a5) + (a3 + a7)), within each 8 lanes
                    float v = __fadd_rn(acc[h], __shfl_down_sync(0xffffffffu, acc[h], 4, 8));
                    v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 2, 8));
                    v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 1, 8));
                    const int ch = lane + 32 * h, rt = ch / 8, t = rt % NT, r = rt / NT;
                    if (ch % 8 == 0 && ch < G::CHAINS && row0 + r < n_out)
                        out[(u64)t * n_out + row0 + r] = QT == QT_Q4_1 ? __fadd_rn(v, summs[h]) : v;
                }
            }
#pragma unroll
            for (int h = 0; h < G::PASSES; h++) acc[h] = summs[h] = 0.f;
        }
        if (!more) break;
        RawUnit nxt[UNR][R];
        gemvo_load<QT, UNR, R>(nxt, P, M, rb, kn, U);
#pragma unroll
        for (int s = 0; s < UNR; s++)
#pragma unroll
            for (int r = 0; r < R; r++) raw[s][r] = nxt[s][r];
        k0 = kn;
        row0 = rn;
    }
}

// Rows of one matrix for block `blk`: prefetch into L2 (before waiting for the previous kernel:
// weights never change during a step), one lane per row.
template <int QT, int NT>
__device__ __forceinline__ void gemvo_prefetch(const u8* P, const u8* M, int U, int n_out, int blk) {
    constexpr int R = Gemvo<QT, NT>::R;
    const int lane = threadIdx.x % 32, row = (blk * GEMVO_WARPS + threadIdx.x / 32) * R + lane;
    if (lane >= R || row >= n_out) return;
    prefetch_l2(P + (u64)row * U * gemvo_pb<QT>(), (u64)U * gemvo_pb<QT>());
    prefetch_l2(M + (u64)row * U * gemvo_mb<QT>(), (u64)U * gemvo_mb<QT>());
}

// Block `blk` of the `nblk` given to this matrix: its warps take row groups blk * 4 + warp, then
// every nblk * 4th (one each when the grid covers the rows, src/matmul/cpu_order.rs: grid).
template <int QT, int NT>
__device__ __forceinline__ void gemvo(const u8* P, const u8* M, const i8* xq, const float2* xm, float* out, int U, int n_out, int blk, int nblk) {
    __shared__ __align__(16) float sm[GEMVO_WARPS][Gemvo<QT, NT>::WORDS];
    constexpr int R = Gemvo<QT, NT>::R;
    const int row0 = (blk * GEMVO_WARPS + threadIdx.x / 32) * R;
    if (row0 >= n_out) return;  // the whole warp
    gemvo_rows<QT, NT>(P, M, xq, xm, out, U, n_out, row0, nblk * GEMVO_WARPS * R, sm[threadIdx.x / 32]);
}

// gemvo3_*: up to three matrices of the same type and input (q/k/v, gate/up) in one launch;
// blocks [0, nb0) compute matrix 0, [nb0, nb0 + nb1) matrix 1, the rest matrix 2.
#define GEMVO(NAME, QT, NT)                                                                                     \
    extern "C" __global__ void __launch_bounds__(128) gemvo_##NAME##_##NT(const u8* P, const u8* M, const i8* xq, \
                                                                          const float2* xm, float* out, int U, int n_out) { \
        gemvo_prefetch<QT, NT>(P, M, U, n_out, blockIdx.x);                                                          \
        GDC();                                                                                                   \
        const u64 c = blockIdx.y; /* the chunk of NT tokens (prefills: one launch for all chunks) */          \
        gemvo<QT, NT>(P, M, xq + c * NT * U * 32, xm + c * NT * U, out + c * NT * n_out, U, n_out, blockIdx.x, gridDim.x); \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(128) gemvo3_##NAME##_##NT(                                      \
        const u8* P0, const u8* M0, float* o0, int n0, int nb0, const u8* P1, const u8* M1, float* o1, int n1, int nb1, \
        const u8* P2, const u8* M2, float* o2, int n2, const i8* xq, const float2* xm, int U) {                 \
        int b = blockIdx.x;                                                                                      \
        if (b < nb0) gemvo_prefetch<QT, NT>(P0, M0, U, n0, b);                                                       \
        else if (b < nb0 + nb1) gemvo_prefetch<QT, NT>(P1, M1, U, n1, b - nb0);                                      \
        else gemvo_prefetch<QT, NT>(P2, M2, U, n2, b - nb0 - nb1);                                                   \
        GDC();                                                                                                   \
        if (b < nb0) gemvo<QT, NT>(P0, M0, xq, xm, o0, U, n0, b, nb0);                                                \
        else if (b < nb0 + nb1) gemvo<QT, NT>(P1, M1, xq, xm, o1, U, n1, b - nb0, nb1);                                \
        else gemvo<QT, NT>(P2, M2, xq, xm, o2, U, n2, b - nb0 - nb1, (int)gridDim.x - nb0 - nb1);                                            \
    }

#define GEMVO_ALL(NAME, QT) GEMVO(NAME, QT, 1) GEMVO(NAME, QT, 2) GEMVO(NAME, QT, 4) GEMVO(NAME, QT, 8)
GEMVO_ALL(q4_0, QT_Q4_0)
GEMVO_ALL(q4_1, QT_Q4_1)
GEMVO_ALL(q8_0, QT_Q8_0)
