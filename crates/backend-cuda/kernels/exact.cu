// Quantized matmul in the CPU backend's float order, for `CudaBackend::set_exact_numerics`:
// every output then has the CPU's bits. The CPU's orders (which are llama.cpp's x86 build's):
// - Q4_1, Q8_0: ggml_vec_dot_{q4_1_q8_1, q8_0_q8_0}'s AVX2 path (crates/backend-cpu/src/simd/
//   x86/ggml_order.rs): per output one 8-lane accumulator, lane l adding d_w * d_a * (the exact
//   integer dot of the block's elements 4l..4l+3) with an FMA block after block, then ggml's
//   hsum_float_8, plus Q4_1's summs = fma(m_w, s_a, summs);
// - Q4_0: llama.cpp's repacked (block_q4_0x8) order (crates/backend-cpu/src/simd/repack.rs):
//   one accumulator, acc = fma(float(the block's exact integer dot), d_w * d_a, acc).
// Eight lanes per output row (four rows a warp), walking the row's blocks in order; grid.y:
// chunks of 8 tokens. Slower than the GEMV / MMQ kernels: only used in exact mode.
template <int QT>
__device__ __forceinline__ void gemvx(const u8* __restrict__ P, const u8* __restrict__ M, const i8* __restrict__ xq,
                                      const float2* __restrict__ xm, float* __restrict__ out, int U, int n_out, int n_tok) {
    const int lane = threadIdx.x % 32, l = lane % 8, rs = lane / 8;
    const int row = (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * 4 + rs;
    const int t0 = blockIdx.y * 8;
    const int nt = min(8, n_tok - t0);
    if (row >= n_out) return;  // the row's 8 lanes leave together
    const unsigned gm = 0xffu << (8 * rs);
    for (int t = 0; t < nt; t++) {
        const i8* xt = xq + (u64)(t0 + t) * U * 32;
        const float2* mt = xm + (u64)(t0 + t) * U;
        float acc = 0.f, summs = 0.f;
        for (int k = 0; k < U; k++) {
            Unit u = load_unit<QT>(P, M, (u64)row, k, U);
            int qw = u.q[0];
#pragma unroll
            for (int i = 1; i < 8; i++)
                if (i == l) qw = u.q[i];
            const int xw = *(const int*)(xt + (u64)k * 32 + 4 * l);
            const float2 xs = mt[k];
            if (QT == QT_Q4_0) {
                // the whole block's integer dot on every lane of the row, then one chain
                int is = dp4a(qw, xw, 0);
                is += __shfl_xor_sync(gm, is, 4, 8);
                is += __shfl_xor_sync(gm, is, 2, 8);
                is += __shfl_xor_sync(gm, is, 1, 8);
                acc = __fmaf_rn((float)is, __fmul_rn(u.s0, xs.x), acc);
                continue;
            }
            if (QT == QT_Q4_1) summs = __fmaf_rn(u.o, xs.y, summs);
            acc = __fmaf_rn(__fmul_rn(u.s0, xs.x), (float)dp4a(qw, xw, 0), acc);
        }
        if (QT == QT_Q4_0) {
            if (l == 0) out[(u64)(t0 + t) * n_out + row] = acc;
            continue;
        }
        // hsum_float_8: (a0 + a4) + (a2 + a6) + ((a1 + a5) + (a3 + a7))
        float v = __fadd_rn(acc, __shfl_down_sync(gm, acc, 4, 8));
        v = __fadd_rn(v, __shfl_down_sync(gm, v, 2, 8));
        v = __fadd_rn(v, __shfl_down_sync(gm, v, 1, 8));
        if (l == 0) out[(u64)(t0 + t) * n_out + row] = QT == QT_Q4_1 ? __fadd_rn(v, summs) : v;
    }
}

#define GEMVX(NAME, QT)                                                                                                 \
    extern "C" __global__ void __launch_bounds__(128) gemvx_##NAME(const u8* P, const u8* M, const i8* xq, const float2* xm, \
                                                                   float* out, int U, int n_out, int n_tok) {          \
        gemvx<QT>(P, M, xq, xm, out, U, n_out, n_tok);                                                                  \
    }
GEMVX(q4_0, QT_Q4_0)
GEMVX(q4_1, QT_Q4_1)
GEMVX(q8_0, QT_Q8_0)
