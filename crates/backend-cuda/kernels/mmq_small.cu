// MMQ for small token counts (up to 32: batched decode; opt-in, QUARREL_CUDA_MMQ_SMALL=1: on an
// H100 they lose to the tiled kernels of mmq.cu at 24-32 tokens), where the matmul is bound by reading
// the weights: no shared-memory weight tile and no barriers in the main loop. Each warp reads
// its mma fragments straight from the repacked weights (thread (g, tig) of an m16 tile needs
// ints tig and 4 + tig of a unit's 8, i.e. values 4·tig .. 4·tig + 3 and 16 + 4·tig ..: one or
// two 4-byte loads per row and unit, decoded in registers) and the Q8 activations' fragments
// from global memory (small, L1/L2-resident). Block: 8 warps on the same 32 rows, warp w taking
// every 8th stage of 8 units of the block's K range; the warps' sums are added in shared
// memory in a fixed order. Same per-unit arithmetic as mmq.cu (exact integer sums from mma
// started at the magic 0x4B400000, f32 scale products), so the twin and the GEMV agree.

#define MMQS_WARPS 8

struct Frag {
    int a0, a1;        // ints tig and 4 + tig of the unit
    float s0, s1, o;   // scales of values 0..15 / 16..31, offset
};

// The fragment of unit k0 + j of `row` for lane quarter `tig` (k0 % 8 == 0; j a compile-time
// constant once unrolled: for K types, the unit within the super-block).
template <int QT>
__device__ __forceinline__ Frag frag_load(const u8* __restrict__ P, const u8* __restrict__ M, u64 row, int k0, int j, int U, int tig) {
    Frag f;
    const u64 g = row * (u64)U + k0 + j;
    if (QT == QT_Q4_0 || QT == QT_Q4_1) {
        const u32 w = *(const u32*)(P + g * 16 + 4 * tig);
        const u32 c = QT == QT_Q4_0 ? 8 : 0;
        f.a0 = sub_bytes(w & 0x0F0F0F0Fu, c);
        f.a1 = sub_bytes((w >> 4) & 0x0F0F0F0Fu, c);
        if (QT == QT_Q4_0) {
            f.s0 = h2f(((const u16*)M)[g]);
            f.o = 0.f;
        } else {
            const u32 dm = ((const u32*)M)[g];
            f.s0 = h2f((u16)(dm & 0xffff));
            f.o = h2f((u16)(dm >> 16));
        }
        f.s1 = f.s0;
    } else if (QT == QT_Q5_0 || QT == QT_Q5_1) {
        const u32 w = *(const u32*)(P + g * 16 + 4 * tig);
        const uint2 meta = ((const uint2*)M)[g];
        const u32 c = QT == QT_Q5_0 ? 16 : 0;
        f.a0 = sub_bytes((w & 0x0F0F0F0Fu) | hbits(meta.y, tig), c);
        f.a1 = sub_bytes(((w >> 4) & 0x0F0F0F0Fu) | hbits(meta.y, tig + 4), c);
        f.s0 = f.s1 = h2f((u16)(meta.x & 0xffff));
        f.o = QT == QT_Q5_1 ? h2f((u16)(meta.x >> 16)) : 0.f;
    } else if (QT == QT_Q8_0) {
        const u8* p = P + g * 32;
        f.a0 = *(const int*)(p + 4 * tig);
        f.a1 = *(const int*)(p + 16 + 4 * tig);
        f.s0 = f.s1 = h2f(((const u16*)M)[g]);
        f.o = 0.f;
    } else if (QT == QT_Q4_K || QT == QT_Q5_K) {
        const int SB = QT == QT_Q4_K ? 144 : 176;
        const u8* b = P + (row * (u64)(U / 8) + k0 / 8) * SB;
        const uint4 hdr = *(const uint4*)b;
        const float d = h2f((u16)(hdr.x & 0xffff)), dmin = h2f((u16)(hdr.x >> 16));
        int sc, m;
        k_scale_min(j, hdr.y, hdr.z, hdr.w, &sc, &m);
        const int QS = QT == QT_Q4_K ? 16 : 48;
        const u8* qs = b + QS + 32 * (j / 2);
        const int sh = 4 * (j & 1);
        u32 w0 = (*(const u32*)(qs + 4 * tig) >> sh) & 0x0F0F0F0Fu;
        u32 w1 = (*(const u32*)(qs + 16 + 4 * tig) >> sh) & 0x0F0F0F0Fu;
        if (QT == QT_Q5_K) {
            const u32 h0 = *(const u32*)(b + 16 + 4 * tig), h1 = *(const u32*)(b + 32 + 4 * tig);
            w0 |= ((h0 >> j) & 0x01010101u) << 4;
            w1 |= ((h1 >> j) & 0x01010101u) << 4;
        }
        f.a0 = (int)w0;
        f.a1 = (int)w1;
        f.s0 = f.s1 = d * (float)sc;
        f.o = -(dmin * (float)m);
    } else {  // QT_Q6_K
        const u8* b = P + (row * (u64)(U / 8) + k0 / 8) * 224;
        const int n = j / 4, kk = j % 4;
        const u8* ql = b + 64 * n + 32 * (kk & 1);
        const u8* qh = b + 128 + 32 * n;
        const int shl = 4 * (kk >> 1), shh = 2 * kk;
        const u32 l0 = *(const u32*)(ql + 4 * tig), l1 = *(const u32*)(ql + 16 + 4 * tig);
        const u32 h0 = *(const u32*)(qh + 4 * tig), h1 = *(const u32*)(qh + 16 + 4 * tig);
        f.a0 = sub_bytes(((l0 >> shl) & 0x0F0F0F0Fu) | (((h0 >> shh) & 0x03030303u) << 4), 32);
        f.a1 = sub_bytes(((l1 >> shl) & 0x0F0F0F0Fu) | (((h1 >> shh) & 0x03030303u) << 4), 32);
        const float d = h2f(*(const u16*)(b + 208));
        const i8* sc = (const i8*)(b + 192);
        f.s0 = d * (float)sc[8 * n + 2 * kk];
        f.s1 = d * (float)sc[8 * n + 2 * kk + 1];
        f.o = 0.f;
    }
    return f;
}

template <int QT, int NT>
__device__ __forceinline__ void mmqs(const u8* __restrict__ P, const u8* __restrict__ M, const i8* __restrict__ xq,
                                     const float2* __restrict__ xm, float* __restrict__ out, int U, int n_out, int n_tok,
                                     int k_per) {
    __shared__ float red[MMQS_WARPS - 1][2][NT][4][32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, tig = lane % 4;
    const int row0 = blockIdx.x * 32;
    const int kb = blockIdx.z * k_per, ke = min(U, kb + k_per);
    out += (u64)blockIdx.z * n_tok * n_out;
    u64 rows[2][2];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) rows[m][h] = (u64)min(row0 + m * 16 + g + 8 * h, n_out - 1);
    // this thread's B columns (token g of each n8 tile) and epilogue columns (2·tig, 2·tig + 1)
    int tb[NT], tc[NT][2];
#pragma unroll
    for (int n = 0; n < NT; n++) {
        tb[n] = min(n * 8 + g, n_tok - 1);
        tc[n][0] = min(n * 8 + 2 * tig, n_tok - 1);
        tc[n][1] = min(n * 8 + 2 * tig + 1, n_tok - 1);
    }
    float acc[2][NT][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][n][i] = 0.f;

    for (int k0 = kb + MMQ_KU * warp; k0 < ke; k0 += MMQ_KU * MMQS_WARPS) {
#pragma unroll
        for (int u = 0; u < MMQ_KU; u++) {
            const int k = k0 + u;
            if (k >= ke) break;  // legacy types' last stage (K types: U % 8 == 0)
            Frag f[2][2];
#pragma unroll
            for (int m = 0; m < 2; m++)
#pragma unroll
                for (int h = 0; h < 2; h++) f[m][h] = frag_load<QT>(P, M, rows[m][h], k0, u, U, tig);
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const i8* xb = xq + ((u64)tb[n] * U + k) * 32;
                const int b0 = *(const int*)(xb + 4 * tig), b1 = *(const int*)(xb + 16 + 4 * tig);
                const float2 x0 = xm[(u64)tc[n][0] * U + k], x1 = xm[(u64)tc[n][1] * U + k];
#pragma unroll
                for (int m = 0; m < 2; m++) {
                    int c0[4] = {MMQ_MAGIC_I, MMQ_MAGIC_I, MMQ_MAGIC_I, MMQ_MAGIC_I};
                    if (QT == QT_Q6_K) {
                        int c1[4] = {MMQ_MAGIC_I, MMQ_MAGIC_I, MMQ_MAGIC_I, MMQ_MAGIC_I};
                        mma_s8_k16(c0, f[m][0].a0, f[m][1].a0, b0);
                        mma_s8_k16(c1, f[m][0].a1, f[m][1].a1, b1);
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            const Frag& w = f[m][i / 2];
                            const float xd = (i & 1) ? x1.x : x0.x;
                            const float t0 = fmaf(w.s0, __int_as_float(c0[i]), -w.s0 * MMQ_MAGIC_F);
                            const float t1 = fmaf(w.s1, __int_as_float(c1[i]), -w.s1 * MMQ_MAGIC_F);
                            acc[m][n][i] = fmaf(xd, t0 + t1, acc[m][n][i]);
                        }
                    } else {
                        mma_s8_k32(c0, f[m][0].a0, f[m][1].a0, f[m][0].a1, f[m][1].a1, b0, b1);
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            const Frag& w = f[m][i / 2];
                            const float xd = (i & 1) ? x1.x : x0.x;
                            const float t0 = fmaf(w.s0, __int_as_float(c0[i]), -w.s0 * MMQ_MAGIC_F);
                            float v = fmaf(xd, t0, acc[m][n][i]);
                            if (QT == QT_Q4_1 || QT == QT_Q5_1 || QT == QT_Q4_K || QT == QT_Q5_K) v = fmaf(w.o, (i & 1) ? x1.y : x0.y, v);
                            acc[m][n][i] = v;
                        }
                    }
                }
            }
        }
    }
    // warps 1.. hand their sums to warp 0, which adds them in warp order
    if (warp > 0) {
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) red[warp - 1][m][n][i][lane] = acc[m][n][i];
    }
    __syncthreads();
    if (warp > 0) return;
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float s = acc[m][n][i];
                for (int w = 0; w < MMQS_WARPS - 1; w++) s += red[w][m][n][i][lane];
                const int row = row0 + m * 16 + g + (i / 2) * 8;
                const int tok = n * 8 + 2 * tig + (i & 1);
                if (row < n_out && tok < n_tok) out[(u64)tok * n_out + row] = s;
            }
}

#define MMQS(NAME, QT, NT)                                                                                         \
    extern "C" __global__ void __launch_bounds__(32 * MMQS_WARPS) mmqs_##NAME##_##NT(                               \
        const u8* P, const u8* M, const i8* xq, const float2* xm, float* out, int U, int n_out, int n_tok, int k_per) { \
        mmqs<QT, NT>(P, M, xq, xm, out, U, n_out, n_tok, k_per);                                                   \
    }
#define MMQS_ALL(NAME, QT) MMQS(NAME, QT, 1) MMQS(NAME, QT, 2) MMQS(NAME, QT, 3) MMQS(NAME, QT, 4)
MMQS_ALL(q4_0, QT_Q4_0)
MMQS_ALL(q4_1, QT_Q4_1)
MMQS_ALL(q5_0, QT_Q5_0)
MMQS_ALL(q5_1, QT_Q5_1)
MMQS_ALL(q8_0, QT_Q8_0)
MMQS_ALL(q4_K, QT_Q4_K)
MMQS_ALL(q5_K, QT_Q5_K)
MMQS_ALL(q6_K, QT_Q6_K)
