// MMQ: quantized weights times Q8 activations for several tokens on the int8 tensor cores
// (mma.sync m16n8k32 s8 -> exact s32 sums per unit; Q6_K, whose halves have their own scales:
// two m16n8k16), f32 accumulation with the scales.
//
// Weights are read in their repacked device layout through `load_unit` (common.cuh): a unit of
// 32 values is 32 int8 q, scales s0 (values 0..15) / s1 (16..31) and an offset o. Activations
// are the Q8 units `quantize_q8` writes: 32 int8 and {d, d * sum(q)} per unit. Per unit:
//   Q6_K:   out += xd * (s0 * I0 + s1 * I1)            (I0, I1: integer sums of the halves)
//   others: out += (float)(I0 + I1) * (s0 * xd) + o * xs
// the same per-unit formula as the dp4a GEMV (matmul.cu), so decode and prefill agree.
//
// Tile: MMQ_BM (64) weight rows x 16 * NT tokens per block of 4 warps (2 x 2); a warp holds
// 32 rows (two m16 tiles) x 8 * NT tokens (NT n8 tiles). Each iteration stages MMQ_KU units of
// the block's rows and tokens in shared memory (rows padded by 4 words: conflict-free
// fragment loads), then runs MMQ_KU k32 steps (2 * MMQ_KU k16 steps for Q6_K). Few blocks (small batches): the units are
// split over blockIdx.z into partial outputs that mmq_reduce sums.

#define MMQ_BM 64
#define MMQ_KU 8
#define MMQ_WS (MMQ_KU * 8 + 4)

// m16n8k32: a0/a1 = rows g / g + 8 at k 4·tig, a2/a3 the same at k 16 + 4·tig; b0/b1 likewise
__device__ __forceinline__ void mma_s8_k32(int (&c)[4], int a0, int a1, int a2, int a3, int b0, int b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_s8_k16(int (&c)[4], int a0, int a1, int b0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

struct MmqScale {
    float s0, s1, o;
};

template <int QT, int NT>
__device__ __forceinline__ void mmq(const u8* __restrict__ P, const u8* __restrict__ M, const i8* __restrict__ xq,
                                    const float2* __restrict__ xm, float* __restrict__ out, int U, int n_out, int n_tok,
                                    int k_per) {
    constexpr int BN = 16 * NT;
    __shared__ int4 ws4[MMQ_BM * MMQ_WS / 4];  // int4: 16-byte aligned rows
    __shared__ int4 xs4[BN * MMQ_WS / 4];
    int* ws = (int*)ws4;
    int* xs = (int*)xs4;
    __shared__ MmqScale wsc[MMQ_BM * MMQ_KU];
    __shared__ float2 xsc[BN * MMQ_KU];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, tig = lane % 4;
    const int row0 = blockIdx.x * MMQ_BM, tok0 = blockIdx.y * BN;
    const int wm = (warp / 2) * 32, wn = (warp % 2) * NT * 8;
    // split K (blockIdx.z): units [kb, ke), partial sums to slice z of `out`
    const int kb = blockIdx.z * k_per, ke = min(U, kb + k_per);
    out += (u64)blockIdx.z * n_tok * n_out;
    float acc[2][NT][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][n][i] = 0.f;

    for (int k0 = kb; k0 < ke; k0 += MMQ_KU) {
        // weights: MMQ_BM x MMQ_KU units, decoded to int8 + scales (units past the split are
        // zeros); trip counts are compile-time constants so that every load is issued first
#pragma unroll
        for (int j = 0; j < MMQ_BM * MMQ_KU / 128; j++) {
            const int i = tid + 128 * j;
            const int r = i / MMQ_KU, u = i % MMQ_KU, k = k0 + u;
            int4* d = (int4*)&ws[r * MMQ_WS + u * 8];
            if (k < ke) {
                Unit un = load_unit<QT>(P, M, (u64)min(row0 + r, n_out - 1), k, U);
                d[0] = make_int4(un.q[0], un.q[1], un.q[2], un.q[3]);
                d[1] = make_int4(un.q[4], un.q[5], un.q[6], un.q[7]);
                wsc[i] = MmqScale{un.s0, un.s1, un.o};
            } else {
                d[0] = d[1] = make_int4(0, 0, 0, 0);
                wsc[i] = MmqScale{0.f, 0.f, 0.f};
            }
        }
        // activations: BN tokens x MMQ_KU units (tokens past the end repeat the last one)
#pragma unroll
        for (int j = 0; j < BN * MMQ_KU / 128; j++) {
            const int i = tid + 128 * j;
            const int t = i / MMQ_KU, u = i % MMQ_KU, k = k0 + u;
            int4* d = (int4*)&xs[t * MMQ_WS + u * 8];
            if (k < ke) {
                u64 src = (u64)min(tok0 + t, n_tok - 1) * U + k;
                const int4* sp = (const int4*)(xq + src * 32);
                d[0] = sp[0];
                d[1] = sp[1];
                xsc[i] = xm[src];
            } else {
                d[0] = d[1] = make_int4(0, 0, 0, 0);
                xsc[i] = make_float2(0.f, 0.f);
            }
        }
        __syncthreads();
#pragma unroll 2
        for (int u = 0; u < MMQ_KU; u++) {
            int a[2][2][2];  // [m tile][half][register]
            MmqScale wv[2][2];  // [m tile][row g / g + 8]
#pragma unroll
            for (int m = 0; m < 2; m++) {
                const int r = wm + m * 16 + g;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    a[m][h][0] = ws[r * MMQ_WS + u * 8 + h * 4 + tig];
                    a[m][h][1] = ws[(r + 8) * MMQ_WS + u * 8 + h * 4 + tig];
                }
                wv[m][0] = wsc[r * MMQ_KU + u];
                wv[m][1] = wsc[(r + 8) * MMQ_KU + u];
            }
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const int t = wn + n * 8 + g;
                const int b0 = xs[t * MMQ_WS + u * 8 + tig];
                const int b1 = xs[t * MMQ_WS + u * 8 + 4 + tig];
                const int tc = wn + n * 8 + 2 * tig;  // this thread's two token columns
                const float2 x0 = xsc[tc * MMQ_KU + u], x1 = xsc[(tc + 1) * MMQ_KU + u];
#pragma unroll
                for (int m = 0; m < 2; m++) {
                    int c0[4] = {0, 0, 0, 0};
                    if (QT == QT_Q6_K) {
                        int c1[4] = {0, 0, 0, 0};
                        mma_s8_k16(c0, a[m][0][0], a[m][0][1], b0);
                        mma_s8_k16(c1, a[m][1][0], a[m][1][1], b1);
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            const MmqScale w = wv[m][i / 2];
                            const float2 x = (i & 1) ? x1 : x0;
                            acc[m][n][i] += x.x * (w.s0 * (float)c0[i] + w.s1 * (float)c1[i]);
                        }
                    } else {
                        mma_s8_k32(c0, a[m][0][0], a[m][0][1], a[m][1][0], a[m][1][1], b0, b1);
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            const MmqScale w = wv[m][i / 2];
                            const float2 x = (i & 1) ? x1 : x0;
                            acc[m][n][i] += (float)c0[i] * (w.s0 * x.x) + w.o * x.y;
                        }
                    }
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int row = row0 + wm + m * 16 + g + (i / 2) * 8;
                const int tok = tok0 + wn + n * 8 + 2 * tig + (i & 1);
                if (row < n_out && tok < n_tok) out[(u64)tok * n_out + row] = acc[m][n][i];
            }
}

#define MMQ(NAME, QT, NT)                                                                                          \
    extern "C" __global__ void __launch_bounds__(128, 4) mmq_##NAME##_##NT(const u8* P, const u8* M, const i8* xq,   \
                                                                        const float2* xm, float* out, int U,      \
                                                                        int n_out, int n_tok, int k_per) {        \
        mmq<QT, NT>(P, M, xq, xm, out, U, n_out, n_tok, k_per);                                                   \
    }
#define MMQ_ALL(NAME, QT) MMQ(NAME, QT, 1) MMQ(NAME, QT, 2) MMQ(NAME, QT, 4)
MMQ_ALL(q4_0, QT_Q4_0)
MMQ_ALL(q4_1, QT_Q4_1)
MMQ_ALL(q5_0, QT_Q5_0)
MMQ_ALL(q5_1, QT_Q5_1)
MMQ_ALL(q8_0, QT_Q8_0)
MMQ_ALL(q4_K, QT_Q4_K)
MMQ_ALL(q5_K, QT_Q5_K)
MMQ_ALL(q6_K, QT_Q6_K)

// Sum of the split-K slices (fixed order: deterministic): out[i] = sum_z part[z * n + i].
extern "C" __global__ void mmq_reduce(const float* __restrict__ part, float* __restrict__ out, int splits, u64 n) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s = part[i];
    for (int z = 1; z < splits; z++) s += part[(u64)z * n + i];
    out[i] = s;
}
