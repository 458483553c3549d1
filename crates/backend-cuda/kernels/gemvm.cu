// GEMVM: the decode GEMV in MMQ's float order (invariant numerics, src/invariant.rs). Every
// output is MMQ's (mmq.cu, unsplit: k_per = U) bit for bit, whatever the token count, so a
// prompt prefilled by MMQ and the same tokens decoded one at a time give the same logits.
//
// MMQ per output, stage by stage (8 units = 256 values, one K-quant super-block):
//   per unit u:     acc = fma(xd_u, round(s0_u * I_u), acc)          (Q6_K: round(s0 I0) + round(s1 I1))
//   per stage:      acc = fma(of, C, acc)  (Q4_K, Q5_K)  or  acc + C  (Q4_1, Q5_1)
// with I the exact integer dot of the unit (32 int8 weights x 32 int8 activations) and C the
// f16 tensor-core sum of the stage's offset products om_u * xs_u (mma m16n8k8, as mmq_offsets).
// Here the integer dots run on dp4a, round(s0 * I) is one rounded product (I is exact in f32),
// and C comes from the same mma instruction over the same operands.
//
// Layout: a block of 128 threads holds 16 rows and walks their units in chunks of 4 stages
// (32 units). Per chunk, thread (row r = tid / 8, quad q = tid % 8) decodes 4 consecutive units
// of row r (`quad_load` / `quad_unit`: MMQ's decoding, the same scales; the 8 threads of a row
// read its 4 super-blocks' bytes in one run) and writes their rounded products to shared
// memory; warp w then sums the offset products of stage w on the tensor cores (16 rows x up to
// 8 tokens: one mma); then thread (r, t) folds row r's chain for token t in MMQ's order. The
// weight loads run GEMVM_DEPTH chunks ahead in registers (decode is bound by bytes in flight).

#ifndef GEMVM_DEPTH
#define GEMVM_DEPTH 2
#endif
#define GEMVM_ROWS 16   // rows per block
#define GEMVM_CHUNK 4   // stages per chunk

template <int QT, int NT>
__device__ __forceinline__ void gemvm_q(const u8* __restrict__ P, const u8* __restrict__ M, const i8* __restrict__ xq,
                                        const float2* __restrict__ xm, float* __restrict__ out, int U, int n_out, int blk,
                                        bool gdc) {
    __shared__ float tp[NT][GEMVM_ROWS][8 * GEMVM_CHUNK + 1];     // rounded unit products (padded: no bank conflicts)
    __shared__ u32 om[GEMVM_ROWS][4 * GEMVM_CHUNK + 1];           // f16 offset multiplier pairs
    __shared__ float of[GEMVM_ROWS][GEMVM_CHUNK + 1];              // the row's offset factor per stage
    __shared__ float cs[GEMVM_CHUNK][GEMVM_ROWS][9];               // offset sums (stage, row, token)
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int r = tid / 8, q = tid % 8, sc = q / 2, h = q % 2;    // this thread's quad
    const int row0 = blk * GEMVM_ROWS;
    const u64 row = (u64)min(row0 + r, n_out - 1);  // rows past the end re-read the last (dropped)
    const int S = (U + 7) / 8;                      // stages
    const int NC = (S + GEMVM_CHUNK - 1) / GEMVM_CHUNK;
    constexpr int D = GEMVM_DEPTH;
    Quad qd[D];
#pragma unroll
    for (int d = 0; d < D; d++)
        if (d < NC) quad_load<QT>(qd[d], P, M, row, 8 * (GEMVM_CHUNK * d + sc) + 4 * h, U, U);
    if (gdc) GDC();
    // fold threads: (row fr, token ft)
    const int fr = tid % GEMVM_ROWS, ft = tid / GEMVM_ROWS;
    float acc = 0.f;
    const int g = lane / 4, tig = lane % 4;
    for (int c0 = 0; c0 < NC; c0 += D) {
#pragma unroll
        for (int d = 0; d < D; d++) {
            const int c = c0 + d;
            if (c >= NC) break;
            const int k0 = 8 * (GEMVM_CHUNK * c + sc) + 4 * h;  // this thread's first unit
            u32 pair = 0u;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const Unit un = quad_unit<QT>(qd[d], j, h);
                if (MMQ_OFS(QT)) {
                    if (j % 2 == 0) pair = (u32)f2h(un.om);
                    else {
                        pair |= (u32)f2h(un.om) << 16;
                        om[r][4 * sc + 2 * h + j / 2] = pair;
                    }
                    if (j == 1 && h == 0) of[r][sc] = un.of;
                }
                const int k = min(k0 + j, U - 1);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    const int4* xp = (const int4*)(xq + ((u64)t * U + k) * 32);
                    const int4 xa = xp[0], xb = xp[1];
                    const int i0 = dp4a(un.q[3], xa.w, dp4a(un.q[2], xa.z, dp4a(un.q[1], xa.y, dp4a(un.q[0], xa.x, 0))));
                    const int i1 = dp4a(un.q[7], xb.w, dp4a(un.q[6], xb.z, dp4a(un.q[5], xb.y, dp4a(un.q[4], xb.x, 0))));
                    tp[t][r][8 * sc + 4 * h + j] = QT == QT_Q6_K ? __fadd_rn(__fmul_rn(un.s0, (float)i0), __fmul_rn(un.s1, (float)i1))
                                                                 : __fmul_rn(un.s0, (float)(i0 + i1));
                }
            }
            if (c + D < NC) quad_load<QT>(qd[d], P, M, row, 8 * (GEMVM_CHUNK * (c + D) + sc) + 4 * h, U, U);
            __syncthreads();
            // warp w: the offset sums of stage w of the chunk (rows g / g + 8, unit pairs
            // 2·tig, 2·tig + 1, token column g), as mmq_offsets
            const int s = GEMVM_CHUNK * c + warp;
            if (MMQ_OFS(QT) && warp < GEMVM_CHUNK && s < S) {
                const u32 a0 = om[g][4 * warp + tig], a1 = om[g + 8][4 * warp + tig];
                u32 b0 = 0u;
                if (g < NT) {
                    const int ka = 8 * s + 2 * tig, kb = ka + 1;
                    const float xa = ka < U ? xm[(u64)g * U + ka].y : 0.f, xb = kb < U ? xm[(u64)g * U + kb].y : 0.f;
                    b0 = (u32)f2h(xa) | ((u32)f2h(xb) << 16);
                }
                float cv[4] = {0.f, 0.f, 0.f, 0.f};
                mma_f16_k8(cv, a0, a1, b0);
#pragma unroll
                for (int i = 0; i < 4; i++) cs[warp][g + 8 * (i / 2)][2 * tig + (i & 1)] = cv[i];
            }
            if (MMQ_OFS(QT)) __syncthreads();
            // the chains in MMQ's order: per stage its units, then its offset sum
            if (ft < NT) {
#pragma unroll
                for (int st = 0; st < GEMVM_CHUNK; st++) {
                    const int ss = GEMVM_CHUNK * c + st;
                    if (ss >= S) break;
#pragma unroll
                    for (int u = 0; u < 8; u++) {
                        const int k = 8 * ss + u;
                        if (k < U) acc = fmaf(xm[(u64)ft * U + k].x, tp[ft][fr][8 * st + u], acc);
                    }
                    if (MMQ_OFS(QT)) acc = (QT == QT_Q4_K || QT == QT_Q5_K) ? fmaf(of[fr][st], cs[st][fr][ft], acc) : __fadd_rn(acc, cs[st][fr][ft]);
                }
            }
            __syncthreads();  // every read of this chunk's products done before the next writes them
        }
    }
    if (ft < NT && row0 + fr < n_out) out[(u64)ft * n_out + row0 + fr] = acc;
}

// out (NT, n_out) = x · Wᵀ over NT tokens (x as Q8 units), blockIdx.y: chunk of NT tokens.
#define GEMVM(NAME, QT, NT)                                                                                             \
    extern "C" __global__ void __launch_bounds__(128) gemvm_##NAME##_##NT(const u8* __restrict__ P,        \
        const u8* __restrict__ M, const i8* __restrict__ xq, const float2* __restrict__ xm, float* __restrict__ out, int U, \
        int n_out) {                                                                                                    \
        const u64 c = blockIdx.y;                                                                                       \
        gemvm_q<QT, NT>(P, M, xq + c * NT * U * 32, xm + c * NT * U, out + c * NT * n_out, U, n_out, blockIdx.x, true);  \
    }
// Routed experts with the routes on the device (moe_route): launch row j (blockIdx.y) is route
// j, expert eids[j] at P + eid * slice_p (M + eid * slice_m), input row j / n_used (x per
// token) or j; blockIdx.z picks one of two matrices of one shape over the same input (gate
// and up; P1 null: one matrix).
#define MOE_GEMVM_DEV(NAME, QT)                                                                                         \
    extern "C" __global__ void __launch_bounds__(128) moe_gemvm_dev_##NAME(const u8* __restrict__ P0,     \
        const u8* __restrict__ M0, float* __restrict__ out0, const u8* __restrict__ P1, const u8* __restrict__ M1,       \
        float* __restrict__ out1, u64 slice_p, u64 slice_m, const u32* __restrict__ eids, int n_used, int per_token,     \
        const i8* __restrict__ xq, const float2* __restrict__ xm, int U, int n_out) {                                   \
        GDC();                                                                                                          \
        const int j = blockIdx.y;                                                                                       \
        const u8* P = blockIdx.z ? P1 : P0;                                                                             \
        const u8* M = blockIdx.z ? M1 : M0;                                                                             \
        float* out = blockIdx.z ? out1 : out0;                                                                          \
        const u64 e = eids[j], s = per_token ? j / n_used : j;                                                          \
        gemvm_q<QT, 1>(P + e * slice_p, M ? M + e * slice_m : M, xq + s * U * 32, xm + s * U, out + (u64)j * n_out, U, n_out, \
                       blockIdx.x, false);                                                                              \
    }
#define GEMVM_ALL(NAME, QT) GEMVM(NAME, QT, 1) GEMVM(NAME, QT, 2) GEMVM(NAME, QT, 4) GEMVM(NAME, QT, 8) MOE_GEMVM_DEV(NAME, QT)
GEMVM_ALL(q4_0, QT_Q4_0)
GEMVM_ALL(q4_1, QT_Q4_1)
GEMVM_ALL(q5_0, QT_Q5_0)
GEMVM_ALL(q5_1, QT_Q5_1)
GEMVM_ALL(q8_0, QT_Q8_0)
GEMVM_ALL(q4_K, QT_Q4_K)
GEMVM_ALL(q5_K, QT_Q5_K)
GEMVM_ALL(q6_K, QT_Q6_K)
