// Shared helpers for Quarrel's CUDA kernels (compiled by NVRTC: no system headers).
// Prepended to every other .cu file of crates/backend-cuda/kernels.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define INF __int_as_float(0x7f800000)

// Programmatic dependent launch (sm_90+): a kernel whose body waits (GDC(), or gdc_wait()
// through a helper) is registered as waiting by build.rs and launched with the
// programmatic-serialization attribute (src/runtime/device.rs), so it may start while the
// previous kernel drains; GDC() waits for the previous grid (complete, memory visible) before
// any global memory access that depends on it, then lets the next kernel's blocks be
// scheduled. Without the attribute, or below sm_90, both are no-ops.
__device__ __forceinline__ void gdc_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void gdc_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
#define GDC()          \
    do {               \
        gdc_wait();    \
        gdc_launch();  \
    } while (0)

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float(((u32)h) << 16); }

// 2^k as a float for -126 <= k <= 127 (exact).
__device__ __forceinline__ float exp2i(int k) { return __int_as_float((k + 127) << 23); }

// ggml's vectorized exp (`ggml_v_expf`, the AVX-512 build's) operation by operation, as the CPU
// backend's twin (crates/backend-cpu/src/ggml_math.rs `expf_ggml`): the same fused
// multiply-adds and roundings, so the same bits. `j * 2^n` in two exact-power steps (scalef).
__device__ __forceinline__ float expf_ggml(float x) {
    const float r = __int_as_float(0x4B400000);  // 0x1.8p23
    float z = fmaf(x, __int_as_float(0x3FB8AA3B), r);
    float n = __fsub_rn(z, r);
    float b = fmaf(-n, __int_as_float(0x35BFBE8E), fmaf(-n, __int_as_float(0x3F317200), x));
    float u = __fmul_rn(b, b);
    float j = fmaf(fmaf(fmaf(__int_as_float(0x3C072010), b, __int_as_float(0x3D2B9F17)), u,
                        fmaf(__int_as_float(0x3E2AAF33), b, __int_as_float(0x3EFFFEDB))),
                   u, fmaf(__int_as_float(0x3F7FFFF6), b, 1.0f));
    if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : INF;
    int ni = (int)n, half = ni / 2;
    return __fmul_rn(__fmul_rn(j, exp2i(half)), exp2i(ni - half));
}

// ggml's vectorized SiLU (`ggml_v_silu`): x / (1 + expf_ggml(-x)).
__device__ __forceinline__ float silu_ggml(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf_ggml(__fsub_rn(0.0f, x)))); }

// libm's expf, which ggml calls outside its vector loops (glibc's is correctly rounded in all
// but rare cases): through f64.
__device__ __forceinline__ float expf_libm(float x) { return (float)exp((double)x); }

__device__ __forceinline__ int dp4a(int a, int b, int c) {
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// Bytes x in [0, 0x80 + c) minus c, as signed bytes (no carries between bytes).
__device__ __forceinline__ int sub_bytes(u32 x, u32 c) {
    u32 k = (0x80u - c) * 0x01010101u;
    return (int)((x + k) ^ 0x80808080u);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ int warp_sum_i(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The sum of every thread's ss over the block (f64, a fixed tree: warps, then the warps' sums),
// returned to every thread; part: 32 doubles of shared memory. Every thread of the block calls it.
__device__ __forceinline__ double block_sum_d(double ss, double* part) {
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
    return part[0];
}

// One warp's 32 consecutive values v (lane i holds value i of Q8 block b) written as Q8:
// xq[b * 32 + lane], xm[b] = {d, d * sum(q)} rounded through f16 (ggml's block_q8_0 / q8_1).
__device__ __forceinline__ void q8_store(float v, i8* __restrict__ xq, float2* __restrict__ xm, u64 b) {
    int lane = threadIdx.x % 32;
    float amax = warp_max(fabsf(v));
    float d = amax / 127.0f;
    float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int q = (int)rintf(v * id);
    xq[b * 32 + lane] = (i8)q;
    int sum = warp_sum_i(q);
    if (lane == 0) xm[b] = make_float2(h2f(f2h(d)), h2f(f2h(d * (float)sum)));
}

// ---------------------------------------------------------------------------------------------
// Quantized weights on the device (src/weights/mod.rs `repack` lays them out on the host).
// A weight of n_out rows of n_in values is read in units of 32 values; unit g = row * U + k.
//   legacy types (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0): payload plane P (16 B of nibbles or 32 B of int8
//     per unit, 16-byte aligned) and meta plane M (2, 4 or 8 B per unit: d [, m] [, qh]);
//   K types (Q4_K Q5_K): ggml super-blocks as stored (144 / 176 B, 16-byte aligned rows);
//   Q6_K: super-blocks padded to 224 B (ql 128, qh 64, scales 16, d 2, pad 14).
// A unit decodes to 32 signed int8 q (8 packed ints, values 0..15 then 16..31), two scales
// (first / second 16 values) and an offset: w = s * q + o.
// ---------------------------------------------------------------------------------------------

#define QT_Q4_0 0
#define QT_Q4_1 1
#define QT_Q5_0 2
#define QT_Q5_1 3
#define QT_Q8_0 4
#define QT_Q4_K 5
#define QT_Q5_K 6
#define QT_Q6_K 7

struct Unit {
    int q[8];
    float s0, s1, o;
    // MMQ's offset terms (mmq.cu: mmq_offsets): o = of * om with om an f16 value (Q4_1 / Q5_1:
    // om = o, of = 1; Q4_K / Q5_K: om = the 6-bit min, of = -dmin); set by quad_unit only
    float om, of;
};

__device__ __forceinline__ void nibbles(uint4 v, int* q, u32 c) {
    u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        q[i] = sub_bytes(w[i] & 0x0F0F0F0Fu, c);
        q[i + 4] = sub_bytes((w[i] >> 4) & 0x0F0F0F0Fu, c);
    }
}

// the 5th bits of values 4i..4i+3 (bits 4i.. of qh) moved to bit 4 of each byte
__device__ __forceinline__ u32 hbits(u32 qh, int i) {
    u32 b = qh >> (4 * i);
    return ((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25);
}

// Q5_0 / Q5_1: the 16 bytes of low nibbles v with the 5th bits qh, minus c, as 8 packed ints
// (values 0..15 then 16..31, as `nibbles`).
__device__ __forceinline__ void q5_values(uint4 v, u32 qh, int* q, u32 c) {
    u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u32 lo = (w[i] & 0x0F0F0F0Fu) | hbits(qh, i);
        u32 hi = ((w[i] >> 4) & 0x0F0F0F0Fu) | hbits(qh, i + 4);
        q[i] = sub_bytes(lo, c);
        q[i + 4] = sub_bytes(hi, c);
    }
}

// byte i (0..11) of the 12 scale bytes held in words a, b, c
__device__ __forceinline__ int sbyte(u32 a, u32 b, u32 c, int i) {
    u32 w = i < 4 ? a : (i < 8 ? b : c);
    return (int)((w >> (8 * (i % 4))) & 0xffu);
}

__device__ __forceinline__ void k_scale_min(int j, u32 a, u32 b, u32 c, int* sc, int* m) {
    if (j < 4) {
        *sc = sbyte(a, b, c, j) & 63;
        *m = sbyte(a, b, c, j + 4) & 63;
    } else {
        *sc = (sbyte(a, b, c, j + 4) & 0xF) | ((sbyte(a, b, c, j - 4) >> 6) << 4);
        *m = (sbyte(a, b, c, j + 4) >> 4) | ((sbyte(a, b, c, j) >> 6) << 4);
    }
}

template <int QT>
__device__ __forceinline__ Unit load_unit(const u8* __restrict__ P, const u8* __restrict__ M, u64 row, int k, int U) {
    Unit u;
    u64 g = row * (u64)U + k;
    if (QT == QT_Q4_0 || QT == QT_Q4_1 || QT == QT_Q5_0 || QT == QT_Q5_1) {
        uint4 v = *(const uint4*)(P + g * 16);
        if (QT == QT_Q4_0 || QT == QT_Q4_1) {
            nibbles(v, u.q, QT == QT_Q4_0 ? 8 : 0);
            if (QT == QT_Q4_0) {
                u.s0 = h2f(((const u16*)M)[g]);
                u.o = 0.f;
            } else {
                u32 dm = ((const u32*)M)[g];
                u.s0 = h2f((u16)(dm & 0xffff));
                u.o = h2f((u16)(dm >> 16));
            }
        } else {
            uint2 meta = ((const uint2*)M)[g];
            q5_values(v, meta.y, u.q, QT == QT_Q5_0 ? 16 : 0);
            u.s0 = h2f((u16)(meta.x & 0xffff));
            u.o = QT == QT_Q5_1 ? h2f((u16)(meta.x >> 16)) : 0.f;
        }
        u.s1 = u.s0;
    } else if (QT == QT_Q8_0) {
        const uint4* p = (const uint4*)(P + g * 32);
        uint4 a = p[0], b = p[1];
        u.q[0] = a.x; u.q[1] = a.y; u.q[2] = a.z; u.q[3] = a.w;
        u.q[4] = b.x; u.q[5] = b.y; u.q[6] = b.z; u.q[7] = b.w;
        u.s0 = u.s1 = h2f(((const u16*)M)[g]);
        u.o = 0.f;
    } else if (QT == QT_Q4_K || QT == QT_Q5_K) {
        const int SB = QT == QT_Q4_K ? 144 : 176;
        const u8* b = P + (row * (u64)(U / 8) + k / 8) * SB;
        int j = k % 8;
        uint4 hdr = *(const uint4*)b;
        float d = h2f((u16)(hdr.x & 0xffff)), dmin = h2f((u16)(hdr.x >> 16));
        int sc, m;
        k_scale_min(j, hdr.y, hdr.z, hdr.w, &sc, &m);
        const int QS = QT == QT_Q4_K ? 16 : 48;
        const uint4* qs = (const uint4*)(b + QS + 32 * (j / 2));
        uint4 a = qs[0], c = qs[1];
        u32 w[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
        int sh = 4 * (j & 1);
        if (QT == QT_Q4_K) {
#pragma unroll
            for (int i = 0; i < 8; i++) u.q[i] = (w[i] >> sh) & 0x0F0F0F0Fu;
        } else {
            const uint4* qh = (const uint4*)(b + 16);
            uint4 h0 = qh[0], h1 = qh[1];
            u32 h[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
            for (int i = 0; i < 8; i++) u.q[i] = ((w[i] >> sh) & 0x0F0F0F0Fu) | (((h[i] >> j) & 0x01010101u) << 4);
        }
        u.s0 = u.s1 = d * (float)sc;
        u.o = -(dmin * (float)m);
    } else {  // QT_Q6_K
        const u8* b = P + (row * (u64)(U / 8) + k / 8) * 224;
        int j = k % 8, n = j / 4, kk = j % 4;
        const uint4* ql = (const uint4*)(b + 64 * n + 32 * (kk & 1));
        const uint4* qh = (const uint4*)(b + 128 + 32 * n);
        uint4 l0 = ql[0], l1 = ql[1], h0 = qh[0], h1 = qh[1];
        u32 L[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
        u32 H[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
        int shl = 4 * (kk >> 1), shh = 2 * kk;
#pragma unroll
        for (int i = 0; i < 8; i++) u.q[i] = sub_bytes(((L[i] >> shl) & 0x0F0F0F0Fu) | (((H[i] >> shh) & 0x03030303u) << 4), 32);
        float d = h2f(*(const u16*)(b + 208));
        const i8* sc = (const i8*)(b + 192);
        u.s0 = d * (float)sc[8 * n + 2 * kk];
        u.s1 = d * (float)sc[8 * n + 2 * kk + 1];
        u.o = 0.f;
    }
    return u;
}

__device__ __forceinline__ float unit_value(const Unit& u, int i) {
    int word = u.q[i / 4];
    int v = (int)(i8)((word >> (8 * (i % 4))) & 0xff);
    return (i < 16 ? u.s0 : u.s1) * (float)v + u.o;
}

// RoPE of the values (x0, x1) of pair i of a head at position p (ops.cu's rope kernels and the
// GEMV epilogue of matmul.cu, the CPU backend's arithmetic): angle p * theta_scale^i multiplied
// up step by step, divided by the pair's frequency factor, times freq_scale; with YaRN (yr: the
// blend weight of each pair) blended with the unscaled angle, and cos / sin times mscale.
__device__ __forceinline__ void rope_rot_s(float x0, float x1, u32 p, const float* __restrict__ ff, int i, float theta_scale,
                                           float freq_scale, const float* __restrict__ yr, float mscale, float* y0, float* y1) {
    float theta = (float)p;
    for (int k = 0; k < i; k++) theta = __fmul_rn(theta, theta_scale);
    float f = ff ? ff[i] : 1.0f;
    float te = __fdiv_rn(theta, f);
    float a = __fmul_rn(freq_scale, te);
    if (yr) {
        float mix = yr[i];
        a = __fadd_rn(__fmul_rn(a, __fsub_rn(1.0f, mix)), __fmul_rn(te, mix));
    }
    // cos / sin rounded from f64: the correctly rounded values, which glibc's cosf / sinf (the
    // CPU backend's, ggml's) give for all but ~1% of angles; CUDA's own are up to 2 ulp off
    double sd, cd;
    sincos((double)a, &sd, &cd);
    float c = __fmul_rn((float)cd, mscale), s = __fmul_rn((float)sd, mscale);
    *y0 = fmaf(x0, c, -__fmul_rn(x1, s));
    *y1 = fmaf(x0, s, __fmul_rn(x1, c));
}

// Plain RoPE (no YaRN, magnitude 1): the fused GEMV epilogues.
__device__ __forceinline__ void rope_rot(float x0, float x1, u32 p, const float* __restrict__ ff, int i, float theta_scale, float freq_scale,
                                         float* y0, float* y1) {
    rope_rot_s(x0, x1, p, ff, i, theta_scale, freq_scale, nullptr, 1.0f, y0, y1);
}

// Paged attention's online softmax for N queries at the start: maxima m = -inf, sums l = 0,
// accumulators (DPL values per lane) 0.
template <int N, int DPL>
__device__ __forceinline__ void softmax_init(float (&m)[N], float (&l)[N], float (&acc)[N][DPL]) {
#pragma unroll
    for (int i = 0; i < N; i++) {
        m[i] = -INF;
        l[i] = 0.f;
#pragma unroll
        for (int d = 0; d < DPL; d++) acc[i][d] = 0.f;
    }
}

// Ask the L2 cache for `bytes` at `p` (Hopper's bulk prefetch; the range is trimmed to 16-byte
// boundaries; a hint: nothing waits for it, nothing is read into registers).
__device__ __forceinline__ void prefetch_l2(const u8* p, u64 bytes) {
#if __CUDA_ARCH__ >= 900
    u64 a = (u64)p, s = (a + 15) & ~15ull, e = (a + bytes) & ~15ull;
    if (e > s)
        asm volatile("{\n\t.reg .u64 g;\n\tcvta.to.global.u64 g, %0;\n\tcp.async.bulk.prefetch.L2.global [g], %1;\n\t}" ::"l"(s), "r"((u32)(e - s))
                     : "memory");
#endif
}
