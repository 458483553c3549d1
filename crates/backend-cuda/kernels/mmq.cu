// MMQ: quantized weights times Q8 activations for several tokens on the int8 tensor cores
// (mma.sync m16n8k32 s8 -> exact s32 sums per unit; Q6_K, whose halves have their own scales:
// two m16n8k16), f32 accumulation with the scales.
//
// Weights are read in their repacked device layout (common.cuh): a unit of 32 values decodes
// to 32 int8 q, scales s0 (values 0..15) / s1 (16..31) and an offset o. Activations are the Q8
// units `quantize_q8` writes once per matmul: 32 int8 and {d, d * sum(q)} per unit. Per unit:
//   Q6_K:   out += xd * (s0 * I0 + s1 * I1)            (I0, I1: integer sums of the halves)
//   others: out += xd * (s * I) + o * xs
// with the integer sums exact (the GEMV's and the CPU's block sums) and f32 scale products.
// The offset terms o * xs of a stage's 8 units (Q4_1, Q5_1, Q4_K, Q5_K) are summed on the
// tensor cores instead (`mmq_offsets`): o = of * om with om an f16 value (the block min, or
// the K types' 6-bit min) and xs f16 (the Q8_1 sum), so one m16n8k8 f16 mma gives the exact
// products summed in f32, then out += of * sum: one FMA per output and stage instead of one
// per unit, which keeps these types' kernels off the FMA pipe's issue limit.
//
// Tile: 32·MMQ_WM weight rows x 16·NT tokens per block of 2·MMQ_WM warps (MMQ_WM along the rows
// x 2 along the tokens); a warp holds 32 rows (two m16 tiles) x 8·NT tokens (NT n8 tiles). One
// stage is MMQ_KU (8) units (256 values: one K-quant super-block per row):
//   - weights: each thread loads the raw bytes of 4 consecutive units of one row into
//     registers one stage ahead (the loads fly while the tensor cores work on the current
//     stage), then decodes them to int8 + scales in shared memory (rows padded by 4 words:
//     conflict-free fragment loads);
//   - activations: copied by cp.async into a double buffer, one stage ahead.
// Integer to float without the slow I2F conversion: each mma starts from the accumulator
// 0x4B400000 (the float 1.5 * 2^23), so its result read as a float is exactly 1.5 * 2^23 + I
// (|I| < 2^22); fma(s, F, -s * 1.5 * 2^23) then gives round(s * I) (s * 1.5 * 2^23 is exact:
// every scale has at most 21 significant bits). Few blocks (small batches): the units are split
// over blockIdx.z into partial outputs that mmq_reduce sums.

#define MMQ_KU 8
#define MMQ_WM 4  // warps along the rows: 128-row tiles (src/matmul/mmq.rs WM; the kernel names' _4)
#define MMQ_WS (MMQ_KU * 8 + 4)
#define MMQ_MAGIC_I 0x4B400000
#define MMQ_MAGIC_F 12582912.0f

// m16n8k32: a0/a1 = rows g / g + 8 at k 4·tig, a2/a3 the same at k 16 + 4·tig; b0/b1 likewise
__device__ __forceinline__ void mma_s8_k32(int (&c)[4], int a0, int a1, int a2, int a3, int b0, int b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// m16n8k8 f16 x f16 -> f32: a0/a1 = rows g / g + 8 at k 2·tig, 2·tig + 1; b0 = k 2·tig, 2·tig + 1 at column g
__device__ __forceinline__ void mma_f16_k8(float (&c)[4], u32 a0, u32 a1, u32 b0) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

// Q4_1, Q5_1, Q4_K, Q5_K: weights with an offset term
#define MMQ_OFS(QT) ((QT) == QT_Q4_1 || (QT) == QT_Q5_1 || (QT) == QT_Q4_K || (QT) == QT_Q5_K)

__device__ __forceinline__ void mma_s8_k16(int (&c)[4], int a0, int a1, int b0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
    u32 d = (u32)__cvta_generic_to_shared(dst);
    int n = ok ? 16 : 0;  // 0: fill the 16 bytes with zeros
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(n));
}

__device__ __forceinline__ void cp_async8(void* dst, const void* src, bool ok) {
    u32 d = (u32)__cvta_generic_to_shared(dst);
    int n = ok ? 8 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(d), "l"(src), "r"(n));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
__device__ __forceinline__ void cp_async_wait1() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

// Raw bytes of 4 consecutive units (k0 .. k0 + 3, k0 % 4 == 0) of one weight row.
struct Quad {
    uint4 v[8];
    u32 m[8];
};

template <int QT>
__device__ __forceinline__ void quad_load(Quad& q, const u8* __restrict__ P, const u8* __restrict__ M, u64 row, int k0, int ke, int U) {
    if (QT <= QT_Q8_0) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const bool ok = k0 + j < ke;
            const u64 g = row * (u64)U + (ok ? k0 + j : 0);
            if (QT == QT_Q8_0) {
                q.v[2 * j] = ok ? ((const uint4*)(P + g * 32))[0] : make_uint4(0, 0, 0, 0);
                q.v[2 * j + 1] = ok ? ((const uint4*)(P + g * 32))[1] : make_uint4(0, 0, 0, 0);
            } else {
                q.v[j] = ok ? *(const uint4*)(P + g * 16) : make_uint4(0, 0, 0, 0);
            }
            if (QT == QT_Q4_0 || QT == QT_Q8_0) {
                q.m[j] = ok ? (u32)((const u16*)M)[g] : 0u;
            } else if (QT == QT_Q4_1) {
                q.m[j] = ok ? ((const u32*)M)[g] : 0u;
            } else {
                uint2 mm = ok ? ((const uint2*)M)[g] : make_uint2(0, 0);
                q.m[j] = mm.x;
                q.m[4 + j] = mm.y;
            }
        }
    } else {
        // K types: U % 8 == 0 and splits on stage bounds, so the 4 units are all in or all out
        const bool ok = k0 < ke;
        const int SB = QT == QT_Q4_K ? 144 : (QT == QT_Q5_K ? 176 : 224);
        const u8* b = P + (row * (u64)(U / 8) + (ok ? k0 / 8 : 0)) * SB;
        const int h = (k0 % 8) / 4;  // which half of the super-block
        const uint4 z = make_uint4(0, 0, 0, 0);
        if (QT == QT_Q4_K || QT == QT_Q5_K) {
            const int QS = QT == QT_Q4_K ? 16 : 48;
            q.v[0] = ok ? *(const uint4*)b : z;
            const uint4* qs = (const uint4*)(b + QS + 64 * h);  // units 4h .. 4h + 3: 2 x 32 bytes
#pragma unroll
            for (int i = 0; i < 4; i++) q.v[1 + i] = ok ? qs[i] : z;
            if (QT == QT_Q5_K) {
                q.v[5] = ok ? ((const uint4*)(b + 16))[0] : z;
                q.v[6] = ok ? ((const uint4*)(b + 16))[1] : z;
            }
        } else {
            const uint4* ql = (const uint4*)(b + 64 * h);
#pragma unroll
            for (int i = 0; i < 4; i++) q.v[i] = ok ? ql[i] : z;
            const uint4* qh = (const uint4*)(b + 128 + 32 * h);
            q.v[4] = ok ? qh[0] : z;
            q.v[5] = ok ? qh[1] : z;
            q.m[0] = ok ? ((const u32*)(b + 192 + 8 * h))[0] : 0u;
            q.m[1] = ok ? ((const u32*)(b + 192 + 8 * h))[1] : 0u;
            q.m[2] = ok ? (u32)(*(const u16*)(b + 208)) : 0u;
        }
    }
}

// Unit j (0..3) of a quad; `h` is the super-block half for K types. Same decoding as
// `load_unit` (common.cuh).
template <int QT>
__device__ __forceinline__ Unit quad_unit(const Quad& q, int j, int h) {
    Unit u;
    if (QT == QT_Q4_0 || QT == QT_Q4_1 || QT == QT_Q5_0 || QT == QT_Q5_1) {
        uint4 v = q.v[j];
        if (QT == QT_Q4_0 || QT == QT_Q4_1) {
            nibbles(v, u.q, QT == QT_Q4_0 ? 8 : 0);
            if (QT == QT_Q4_0) {
                u.s0 = h2f((u16)q.m[j]);
                u.o = 0.f;
            } else {
                u.s0 = h2f((u16)(q.m[j] & 0xffff));
                u.o = h2f((u16)(q.m[j] >> 16));
            }
        } else {
            q5_values(v, q.m[4 + j], u.q, QT == QT_Q5_0 ? 16 : 0);
            u.s0 = h2f((u16)(q.m[j] & 0xffff));
            u.o = QT == QT_Q5_1 ? h2f((u16)(q.m[j] >> 16)) : 0.f;
        }
        u.s1 = u.s0;
        u.om = u.o;
        u.of = 1.f;
    } else if (QT == QT_Q8_0) {
        uint4 a = q.v[2 * j], b = q.v[2 * j + 1];
        u.q[0] = a.x; u.q[1] = a.y; u.q[2] = a.z; u.q[3] = a.w;
        u.q[4] = b.x; u.q[5] = b.y; u.q[6] = b.z; u.q[7] = b.w;
        u.s0 = u.s1 = h2f((u16)q.m[j]);
        u.o = 0.f;
    } else if (QT == QT_Q4_K || QT == QT_Q5_K) {
        const int jj = 4 * h + j;  // unit within the super-block
        uint4 hdr = q.v[0];
        float d = h2f((u16)(hdr.x & 0xffff)), dmin = h2f((u16)(hdr.x >> 16));
        int sc, m;
        k_scale_min(jj, hdr.y, hdr.z, hdr.w, &sc, &m);
        uint4 a = q.v[1 + 2 * (j / 2)], c = q.v[2 + 2 * (j / 2)];
        u32 w[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
        const int sh = 4 * (j & 1);
        if (QT == QT_Q4_K) {
#pragma unroll
            for (int i = 0; i < 8; i++) u.q[i] = (w[i] >> sh) & 0x0F0F0F0Fu;
        } else {
            uint4 h0 = q.v[5], h1 = q.v[6];
            u32 hb[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
            for (int i = 0; i < 8; i++) u.q[i] = ((w[i] >> sh) & 0x0F0F0F0Fu) | (((hb[i] >> jj) & 0x01010101u) << 4);
        }
        u.s0 = u.s1 = d * (float)sc;
        u.o = -(dmin * (float)m);
        u.om = (float)m;
        u.of = -dmin;
    } else {  // QT_Q6_K: unit 4h + j -> n = h, kk = j
        const int kk = j;
        uint4 l0 = q.v[2 * (kk & 1)], l1 = q.v[2 * (kk & 1) + 1], h0 = q.v[4], h1 = q.v[5];
        u32 L[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
        u32 H[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
        const int shl = 4 * (kk >> 1), shh = 2 * kk;
#pragma unroll
        for (int i = 0; i < 8; i++) u.q[i] = sub_bytes(((L[i] >> shl) & 0x0F0F0F0Fu) | (((H[i] >> shh) & 0x03030303u) << 4), 32);
        const float d = h2f((u16)q.m[2]);
        const u32 sw = q.m[kk / 2];  // scale bytes 2kk, 2kk + 1 of this half
        u.s0 = d * (float)(int)(i8)((sw >> (16 * (kk & 1))) & 0xff);
        u.s1 = d * (float)(int)(i8)((sw >> (16 * (kk & 1) + 8)) & 0xff);
        u.o = 0.f;
    }
    return u;
}

// One unit (32 values) of a stage: the warp's mma over its 32 rows x 8·NT tokens and the
// scale epilogue into acc. FULL: every n8 tile of the warp holds tokens (else only the first
// nv; a separate instantiation, so that the full tiles' code has no per-tile branches).
template <int QT, int NT, bool FULL>
__device__ __forceinline__ void mmq_unit(float (&acc)[2][NT][4], const int* __restrict__ wsb, const float4* __restrict__ wscb,
                                         const int* __restrict__ xb, const float2* __restrict__ xc, int u, int wm, int wn,
                                         int g, int tig, int nv) {
    constexpr int BN = 16 * NT, MMQ_BM = 32 * MMQ_WM;
    int a[2][2][2];     // [m tile][half][register]
    float4 wv[2][2];    // [m tile][row g / g + 8]
#pragma unroll
    for (int m = 0; m < 2; m++) {
        const int r = wm + m * 16 + g;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            a[m][h][0] = wsb[r * MMQ_WS + u * 8 + h * 4 + tig];
            a[m][h][1] = wsb[(r + 8) * MMQ_WS + u * 8 + h * 4 + tig];
        }
        wv[m][0] = wscb[u * MMQ_BM + r];
        wv[m][1] = wscb[u * MMQ_BM + r + 8];
    }
#pragma unroll
    for (int n = 0; n < NT; n++) {
        if (!FULL && n >= nv) continue;
        const int t = wn + n * 8 + g;
        const int b0 = xb[t * MMQ_WS + u * 8 + tig];
        const int b1 = xb[t * MMQ_WS + u * 8 + 4 + tig];
        const int tc = wn + n * 8 + 2 * tig;  // this thread's two token columns
        const float4 x01 = *(const float4*)&xc[u * BN + tc];  // xd0, xs0, xd1, xs1
#pragma unroll
        for (int m = 0; m < 2; m++) {
            int c0[4] = {MMQ_MAGIC_I, MMQ_MAGIC_I, MMQ_MAGIC_I, MMQ_MAGIC_I};
            if (QT == QT_Q6_K) {
                int c1[4] = {MMQ_MAGIC_I, MMQ_MAGIC_I, MMQ_MAGIC_I, MMQ_MAGIC_I};
                mma_s8_k16(c0, a[m][0][0], a[m][0][1], b0);
                mma_s8_k16(c1, a[m][1][0], a[m][1][1], b1);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float4 w = wv[m][i / 2];
                    const float xd = (i & 1) ? x01.z : x01.x;
                    const float t0 = fmaf(w.x, __int_as_float(c0[i]), w.y);
                    const float t1 = fmaf(w.z, __int_as_float(c1[i]), w.w);
                    acc[m][n][i] = fmaf(xd, t0 + t1, acc[m][n][i]);
                }
            } else {
                mma_s8_k32(c0, a[m][0][0], a[m][0][1], a[m][1][0], a[m][1][1], b0, b1);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float4 w = wv[m][i / 2];
                    const float xd = (i & 1) ? x01.z : x01.x;
                    const float t0 = fmaf(w.x, __int_as_float(c0[i]), w.y);
                    acc[m][n][i] = fmaf(xd, t0, acc[m][n][i]);  // offsets: mmq_offsets, per stage
                }
            }
        }
    }
}

// The offset terms of a stage's 8 units (MMQ_OFS types) into acc: per output
// of · Σ_u om_u · xs_u, the sum on the tensor cores (exact f16 products, f32 sums). The weight
// tile's .w holds, per row, the packed f16 pair (om_2p, om_2p+1) at unit 2p and of at unit 1.
template <int QT, int NT, bool FULL>
__device__ __forceinline__ void mmq_offsets(float (&acc)[2][NT][4], const float4* __restrict__ wscb, const float2* __restrict__ xc,
                                            int wm, int wn, int g, int tig, int nv) {
    constexpr int BN = 16 * NT, MMQ_BM = 32 * MMQ_WM;
    constexpr bool K = QT == QT_Q4_K || QT == QT_Q5_K;
    u32 a[2][2];
    float f[2][2];
#pragma unroll
    for (int m = 0; m < 2; m++) {
        const int r = wm + m * 16 + g;
        a[m][0] = __float_as_uint(wscb[2 * tig * MMQ_BM + r].w);
        a[m][1] = __float_as_uint(wscb[2 * tig * MMQ_BM + r + 8].w);
        f[m][0] = K ? wscb[MMQ_BM + r].w : 1.f;
        f[m][1] = K ? wscb[MMQ_BM + r + 8].w : 1.f;
    }
#pragma unroll
    for (int n = 0; n < NT; n++) {
        if (!FULL && n >= nv) continue;
        const int t = wn + n * 8 + g;
        const u32 b0 = (u32)f2h(xc[2 * tig * BN + t].y) | ((u32)f2h(xc[(2 * tig + 1) * BN + t].y) << 16);
#pragma unroll
        for (int m = 0; m < 2; m++) {
            float c[4] = {0.f, 0.f, 0.f, 0.f};
            mma_f16_k8(c, a[m][0], a[m][1], b0);
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][n][i] = K ? fmaf(f[m][i / 2], c[i], acc[m][n][i]) : acc[m][n][i] + c[i];
        }
    }
}

// ID (grouped expert matmul, mmq_id_*): the block's tokens are rows src[0 .. n_tok) of the
// activations and go to rows dst[0 .. n_tok) of `out` (no token tiles along blockIdx.y, no
// split K: the wrapper points P, M, src, dst at the block's work item).
// DB: two weight tiles in shared memory, one barrier per stage: each warp decodes the next
// stage's weights into the other tile right after its own tensor-core work on this one (no
// block-wide wait between the decode and the multiplies; same sums, same order).
template <int QT, int NT, bool ID = false, bool DB = false>
__device__ __forceinline__ void mmq(const u8* __restrict__ P, const u8* __restrict__ M, const i8* __restrict__ xq,
                                    const float2* __restrict__ xm, float* __restrict__ out, int U, int n_out, int n_tok,
                                    int k_per, const u32* __restrict__ src = nullptr, const u32* __restrict__ dst = nullptr) {
    constexpr int BN = 16 * NT, MMQ_BM = 32 * MMQ_WM, MMQ_THREADS = 64 * MMQ_WM;
    extern __shared__ int4 smem4[];
    constexpr int NW = DB ? 2 : 1;                             // weight tiles
    int* ws = (int*)smem4;                                     // [NW][MMQ_BM][MMQ_WS]
    float4* wsc = (float4*)(ws + NW * MMQ_BM * MMQ_WS);        // [NW][MMQ_KU][MMQ_BM]: s0, -s0·M, then s1, -s1·M (Q6_K) or o, offset pair / factor (mmq_offsets)
    int* xs = (int*)(wsc + NW * MMQ_KU * MMQ_BM);              // [2][BN][MMQ_WS]
    float2* xsc = (float2*)(xs + 2 * BN * MMQ_WS);             // [2][MMQ_KU][BN]
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, tig = lane % 4;
    const int row0 = blockIdx.x * MMQ_BM, tok0 = ID ? 0 : blockIdx.y * BN;
    // activation row of each of the block's token slots (slots past n_tok repeat the last)
    __shared__ u32 xrow[BN];
    for (int t = tid; t < BN; t += MMQ_THREADS) {
        const int tt = min(tok0 + t, n_tok - 1);
        xrow[t] = ID ? src[tt] : (u32)tt;
    }
    __syncthreads();
    const int wm = (warp / 2) * 32, wn = (warp % 2) * NT * 8;
    // split K (blockIdx.z): units [kb, ke), partial sums to slice z of `out`
    const int kb = blockIdx.z * k_per, ke = min(U, kb + k_per);
    out += (u64)blockIdx.z * n_tok * n_out;
    // this thread's weight quad: row lr, units 4·lh .. 4·lh + 3 of each stage
    const int lr = tid / 2, lh = tid % 2;
    const u64 wrow = (u64)min(row0 + lr, n_out - 1);

    float acc[2][NT][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][n][i] = 0.f;

    // grouped items fill part of the token tile: token slots from `tlim` on (past the last
    // n8 tile holding a route) are neither loaded nor multiplied; n8 tiles of this warp from
    // `nv` on hold no route (a warp with none skips the tensor-core loop)
    // (the 128-route tile only: the one-launch plans put items of any size there)
    constexpr bool SKIP = ID && NT == 8;
    const int tlim = SKIP ? min(BN, (n_tok + 7) / 8 * 8) : BN;
    const int nv = SKIP ? max(0, min(NT, (n_tok - wn + 7) / 8)) : NT;
    // activations of the stage at k0 into buffer `buf` (cp.async; units past ke are zeros,
    // tokens past the end repeat the last one)
    auto load_x = [&](int k0, int buf) {
        int* xb = xs + buf * BN * MMQ_WS;
        float2* xc = xsc + buf * MMQ_KU * BN;
#pragma unroll
        for (int j = 0; j < BN * MMQ_KU * 2 / MMQ_THREADS; j++) {
            const int i = tid + MMQ_THREADS * j;  // 16-byte chunk: token i / 16, unit (i / 2) % 8, half i % 2
            const int t = i / 16, u = (i / 2) % MMQ_KU, hf = i % 2, k = k0 + u;
            const bool ok = k < ke;
            const u64 xi = (u64)xrow[t] * U + (ok ? k : 0);
            if (!SKIP || t < tlim) cp_async16(&xb[t * MMQ_WS + u * 8 + hf * 4], xq + xi * 32 + hf * 16, ok);
        }
        if (BN * MMQ_KU >= MMQ_THREADS || tid < BN * MMQ_KU) {
#pragma unroll
            for (int j = 0; j < (BN * MMQ_KU + MMQ_THREADS - 1) / MMQ_THREADS; j++) {
                const int i = tid + MMQ_THREADS * j;  // token i % BN, unit i / BN
                const int t = i % BN, u = i / BN, k = k0 + u;
                const bool ok = k < ke;
                const u64 xi = (u64)xrow[t] * U + (ok ? k : 0);
                if (!SKIP || t < tlim) cp_async8(&xc[u * BN + t], xm + xi, ok);
            }
        }
    };

    Quad qd;
    // the quad's units decoded into weight tile `wb`
    auto decode = [&](int wb) {
        int* w = ws + wb * MMQ_BM * MMQ_WS;
        float4* wc = wsc + wb * MMQ_KU * MMQ_BM;
#pragma unroll
        for (int j = 0; j < 4; j += 2) {
            // units u (even) and u + 1; .w: their f16 offset multipliers packed at u, the
            // row's offset factor at u + 1 (mmq_offsets)
            const Unit un[2] = {quad_unit<QT>(qd, j, lh), quad_unit<QT>(qd, j + 1, lh)};
            const int u = 4 * lh + j;
            const float pair = __uint_as_float((u32)f2h(un[0].om) | ((u32)f2h(un[1].om) << 16));
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int4* d = (int4*)&w[lr * MMQ_WS + (u + e) * 8];
                d[0] = make_int4(un[e].q[0], un[e].q[1], un[e].q[2], un[e].q[3]);
                d[1] = make_int4(un[e].q[4], un[e].q[5], un[e].q[6], un[e].q[7]);
                wc[(u + e) * MMQ_BM + lr] = QT == QT_Q6_K ? make_float4(un[e].s0, -un[e].s0 * MMQ_MAGIC_F, un[e].s1, -un[e].s1 * MMQ_MAGIC_F)
                                                          : make_float4(un[e].s0, -un[e].s0 * MMQ_MAGIC_F, un[e].o, MMQ_OFS(QT) ? (e == 0 ? pair : un[1].of) : 0.f);
            }
        }
    };
    quad_load<QT>(qd, P, M, wrow, kb + 4 * lh, ke, U);
    load_x(kb, 0);
    cp_async_commit();
    if (DB) {
        decode(0);
        if (kb + MMQ_KU < ke) quad_load<QT>(qd, P, M, wrow, kb + MMQ_KU + 4 * lh, ke, U);
    }

    int buf = 0;
    for (int k0 = kb; k0 < ke; k0 += MMQ_KU, buf ^= 1) {
        const bool more = k0 + MMQ_KU < ke;
        int wb = 0;
        if (DB) {
            // this stage's activations landed and its weights are decoded (by every thread);
            // every warp is done with the last stage's tiles, which the next stage takes
            asm volatile("cp.async.wait_group 0;" ::: "memory");
            __syncthreads();
            if (more) load_x(k0 + MMQ_KU, buf ^ 1);
            cp_async_commit();
            wb = buf;
        } else {
            // decode this stage's weights into shared memory (the last stage's readers are done)
            decode(0);
            // the next stage: activations by cp.async, weights' raw bytes into registers
            if (more) load_x(k0 + MMQ_KU, buf ^ 1);
            cp_async_commit();
            cp_async_wait1();
            __syncthreads();
            if (more) quad_load<QT>(qd, P, M, wrow, k0 + MMQ_KU + 4 * lh, ke, U);
        }
        const int* wsb = ws + wb * MMQ_BM * MMQ_WS;
        const float4* wscb = wsc + wb * MMQ_KU * MMQ_BM;
        const int* xb = xs + buf * BN * MMQ_WS;
        const float2* xc = xsc + buf * MMQ_KU * BN;
        if (nv == NT) {
#pragma unroll 2
            for (int u = 0; u < MMQ_KU; u++) mmq_unit<QT, NT, true>(acc, wsb, wscb, xb, xc, u, wm, wn, g, tig, nv);
            if (MMQ_OFS(QT)) mmq_offsets<QT, NT, true>(acc, wscb, xc, wm, wn, g, tig, nv);
        } else if (nv > 0) {
#pragma unroll 2
            for (int u = 0; u < MMQ_KU; u++) mmq_unit<QT, NT, false>(acc, wsb, wscb, xb, xc, u, wm, wn, g, tig, nv);
            if (MMQ_OFS(QT)) mmq_offsets<QT, NT, false>(acc, wscb, xc, wm, wn, g, tig, nv);
        }
        if (DB) {
            // the next stage's weights into the other tile, then the raw bytes of the one after
            if (more) {
                decode(buf ^ 1);
                if (k0 + 2 * MMQ_KU < ke) quad_load<QT>(qd, P, M, wrow, k0 + 2 * MMQ_KU + 4 * lh, ke, U);
            }
        } else {
            __syncthreads();
        }
    }
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int row = row0 + wm + m * 16 + g + (i / 2) * 8;
                const int tok = tok0 + wn + n * 8 + 2 * tig + (i & 1);
                if (row < n_out && tok < n_tok) out[(u64)(ID ? dst[tok] : (u32)tok) * n_out + row] = acc[m][n][i];
            }
}

// Blocks per multiprocessor the register budget allows: with two or more, one block decodes
// its weights while another is on the tensor cores.
#define MMQ(NAME, QT, NT, MINB)                                                                                    \
    extern "C" __global__ void __launch_bounds__(64 * MMQ_WM, MINB) mmq_##NAME##_##NT##_4(                         \
        const u8* P, const u8* M, const i8* xq, const float2* xm, float* out, int U, int n_out, int n_tok, int k_per) { \
        mmq<QT, NT>(P, M, xq, xm, out, U, n_out, n_tok, k_per);                                                    \
    }
// mmq_<type>_8_4d: the 128 x 128 tile with two weight tiles (DB above)
#define MMQ_DB(NAME, QT)                                                                                           \
    extern "C" __global__ void __launch_bounds__(256, 1) mmq_##NAME##_8_4d(                                         \
        const u8* P, const u8* M, const i8* xq, const float2* xm, float* out, int U, int n_out, int n_tok, int k_per) { \
        mmq<QT, 8, false, true>(P, M, xq, xm, out, U, n_out, n_tok, k_per);                                        \
    }
#define MMQ_ALL(NAME, QT) MMQ(NAME, QT, 1, 2) MMQ(NAME, QT, 2, 2) MMQ(NAME, QT, 4, 1) MMQ_DB(NAME, QT)
// The dense kernels in the "mmq" NVRTC unit, the grouped expert ones (below) in "mmq_id"
// (MMQ_ID_UNIT): two units compiled in parallel instead of one twice as long. The "gemvm" unit
// (GEMVM_UNIT: gemvm.cu after this file) takes the helpers only.
#if !defined(MMQ_ID_UNIT) && !defined(GEMVM_UNIT)
MMQ_ALL(q4_0, QT_Q4_0)
MMQ_ALL(q4_1, QT_Q4_1)
MMQ_ALL(q5_0, QT_Q5_0)
MMQ_ALL(q5_1, QT_Q5_1)
MMQ_ALL(q8_0, QT_Q8_0)
MMQ_ALL(q4_K, QT_Q4_K)
MMQ_ALL(q5_K, QT_Q5_K)
MMQ_ALL(q6_K, QT_Q6_K)
#endif

// Grouped expert matmul (ggml's mul_mat_id idea): one launch over (row block: blockIdx.x,
// work item: blockIdx.y). Work item w = items[3w .. 3w + 2]: the expert's payload and meta
// planes, then (offset | count << 32) into src / dst: at most 16·NT routes of that expert,
// activation rows src[..] (Q8: xq, xm; a token or a route), output rows dst[..] (route order).
// Every unit of a row in one block (no split K); per route the same integer block sums and
// scale products as the dense MMQ and the decode GEMV.
// n_items (or null): the item count lives on the device (items planned by moe_plan); blocks
// past it return at once.
#define MMQ_ID(NAME, QT, NT, MINB) MMQ_IDX(NAME, QT, NT, MINB, false, NT##_4)
#define MMQ_IDX(NAME, QT, NT, MINB, DB, SUFFIX)                                                                    \
    extern "C" __global__ void __launch_bounds__(64 * MMQ_WM, MINB) mmq_id_##NAME##_##SUFFIX(                      \
        const u64* __restrict__ items, const u32* __restrict__ src, const u32* __restrict__ dst, const i8* xq,     \
        const float2* xm, float* out, int U, int n_out, const u32* __restrict__ n_items) {                         \
        if (n_items && blockIdx.y >= *n_items) return;                                                             \
        const u64* it = items + 3 * (u64)blockIdx.y;                                                               \
        const u32 off = (u32)it[2], cnt = (u32)(it[2] >> 32);                                                      \
        mmq<QT, NT, true, DB>((const u8*)it[0], (const u8*)it[1], xq, xm, out, U, n_out, (int)cnt, U, src + off, dst + off); \
    }
#define MMQ_ID_ALL(NAME, QT)                                                                                       \
    MMQ_ID(NAME, QT, 1, 2) MMQ_ID(NAME, QT, 2, 2) MMQ_ID(NAME, QT, 4, 1) MMQ_IDX(NAME, QT, 8, 1, true, 8_4d)
#ifdef MMQ_ID_UNIT
MMQ_ID_ALL(q4_0, QT_Q4_0)
MMQ_ID_ALL(q4_1, QT_Q4_1)
MMQ_ID_ALL(q5_0, QT_Q5_0)
MMQ_ID_ALL(q5_1, QT_Q5_1)
MMQ_ID_ALL(q8_0, QT_Q8_0)
MMQ_ID_ALL(q4_K, QT_Q4_K)
MMQ_ID_ALL(q5_K, QT_Q5_K)
MMQ_ID_ALL(q6_K, QT_Q6_K)
#endif

// Sum of the split-K slices (fixed order: deterministic): out[i] = sum_z part[z * n + i].
extern "C" __global__ void mmq_reduce(const float* __restrict__ part, float* __restrict__ out, int splits, u64 n) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s = part[i];
    for (int z = 1; z < splits; z++) s += part[(u64)z * n + i];
    out[i] = s;
}
