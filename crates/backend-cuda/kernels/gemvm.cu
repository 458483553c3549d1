// GEMVM: the decode GEMV in MMQ's float order (invariant numerics, src/matmul/mmq_order.rs). Every
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
// Layout: a block holds 16 rows; GEMVM_W compute warps split the row's stages, F fold
// warps run the chains and one copy warp feeds them. Round k of a row group is its stages
// kW .. kW + W - 1: in every row a contiguous run of bytes (K-quant super-blocks, or the quant
// and meta planes of 8W units), which the copy warp brings into one of GEMVM_NB buffers in
// shared memory with the bulk-copy engine (one cp.async.bulk per row and plane, plus the
// round's Q8 activations and their scales per token; completion counted in bytes on the
// buffer's mbarrier; the routes and job of a group read once per group, not per round), so
// the weight stream needs no registers, no per-lane 64-bit addresses and no uncoalesced loads
// (lanes loading their bytes from global memory would be bound by L1 wavefronts and global-load
// latency). The dense kernels' weights of the first
// rounds are asked for before the PDL wait (they do not depend on the previous kernel).
// Compute warp w takes stage w of each round; lane (row r = lane / 2, half h = lane % 2) decodes
// the 4 units 4h .. 4h + 3 of row r from the buffer (`quad_load` / `quad_unit`: MMQ's decoding,
// the same scales), frees the buffer once the products are made, writes the rounded products
// to the round's slot, and the warp sums the stage's offset products on the tensor cores (16
// rows x up to 8 tokens: one mma, the A operand gathered by shuffles). Fold thread (row, token)
// walks the rounds in order, folding each stage's units (their activation scales staged in the
// slot too) then its offset sum. Slots form a ring of GEMVM_NS rounds with an mbarrier pair each
// (full: the W compute warps wrote it; empty: the fold read it; one arrival per warp), buffers a
// ring of GEMVM_NB (full: bytes landed; empty: the W compute warps read it): no warp waits on a
// block-wide barrier.

#define GEMVM_NB 3           // weight buffers: rounds in flight in the copy engine
#define GEMVM_NS 4           // product slots of one- and two-token blocks
#define GEMVM_ROWS 16        // rows per block
#define GEMVM_W 8            // compute warps per block
#define GEMVM_RU (8 * GEMVM_W)  // units per round
#define GEMVM_TPS (8 * GEMVM_W + 8)  // row stride of a slot's products (padded: conflict-free float4 stores)

// A buffer's rows (src/matmul/mmq_order.rs `dims` mirrors it): K types one run of W super-blocks (SB
// bytes each) per row, others the quant plane (PU bytes per unit) and the meta plane (MSZ);
// each row padded by 16 bytes (rows 4 banks apart: conflict-free 16-byte loads).
template <int QT>
struct GemvmPlanes {
    static constexpr bool K = QT == QT_Q4_K || QT == QT_Q5_K || QT == QT_Q6_K;
    static constexpr int SB = QT == QT_Q4_K ? 144 : (QT == QT_Q5_K ? 176 : 224);
    static constexpr int PU = QT == QT_Q8_0 ? 32 : 16;
    static constexpr int MSZ = (QT == QT_Q4_0 || QT == QT_Q8_0) ? 2 : (QT == QT_Q4_1 ? 4 : 8);
    static constexpr int RSP = (K ? GEMVM_W * SB : GEMVM_RU * PU) + 16;
    static constexpr int RSM = K ? 0 : GEMVM_RU * MSZ + 16;
};

// Shared memory of a block over NT tokens (src/matmul/mmq_order.rs `dims` mirrors it): NS slots, then
// NB buffers, then the mbarriers.
template <int QT, int NT>
struct GemvmShape {
    using PL = GemvmPlanes<QT>;
    static constexpr int NS = NT <= 2 ? GEMVM_NS : 2;        // slots (rounds in flight)
    static constexpr int F = NT <= 2 ? 1 : NT / 2;           // fold warps: 16 rows x NT tokens
    static constexpr int THREADS = 32 * (GEMVM_W + F + 1);
    static constexpr int TP = NT * GEMVM_ROWS * GEMVM_TPS;   // products (token, row, stage unit)
    static constexpr int CS = GEMVM_W * NT * GEMVM_ROWS;     // offset sums (stage, token, row)
    static constexpr int OF = GEMVM_W * GEMVM_ROWS;          // offset factors (stage, row)
    static constexpr int XS = GEMVM_W * NT * 8;              // activation scales (stage, token, unit)
    static constexpr int SLOT = TP + CS + OF + XS;           // floats per slot
    static constexpr int XB = NT * GEMVM_RU * 32;            // a buffer's activations (token, unit, 32 int8)
    static constexpr int XM = NT * GEMVM_RU * 8;             // and their scales (token, unit, {d, sum})
    static constexpr int BUF = GEMVM_ROWS * (PL::RSP + PL::RSM) + XB + XM;  // bytes per buffer
    // GEMVM_NB buffers, fewer where they would not fit a block's 227 KB (8 tokens of Q6_K, Q8_0)
    __device__ static constexpr int bytes(int nb) { return NS * SLOT * 4 + nb * BUF + (2 * NS + 2 * nb) * 8; }
    __device__ static constexpr int fit(int nb) { return nb > 1 && bytes(nb) > 227 * 1024 ? fit(nb - 1) : nb; }
    static constexpr int NB = fit(GEMVM_NB);
    static constexpr int SMEM = bytes(NB);
    // per multiprocessor (the register budget): three one-token blocks where their shared
    // memory fits (228 KB, 1 KB each reserved), else two
    static constexpr int MIN_BLOCKS = NT == 1 ? (3 * (SMEM + 1024) <= 228 * 1024 ? 3 : 2) : (NT == 2 ? 2 : 1);
};

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(u64* b, u32 n) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(n) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u64* b) {
    asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.shared.b64 st, [%0];\n\t}" ::"r"(smem_u32(b)) : "memory");
}
// Arrive and expect `bytes` more from the copy engine in this phase.
__device__ __forceinline__ void mbar_arrive_tx(u64* b, u32 bytes) {
    asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n\t}" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
// Expect `bytes` more without arriving.
__device__ __forceinline__ void mbar_expect_tx(u64* b, u32 bytes) {
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
// Wait until the phase of parity `parity` of barrier b has completed.
__device__ __forceinline__ void mbar_wait(u64* b, u32 parity) {
    u32 done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(smem_u32(b)), "r"(parity)
                     : "memory");
    } while (!done);
}
// `bytes` (a multiple of 16, both ends 16-byte aligned) from global memory to shared memory by
// the bulk-copy engine, counted on barrier `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, u32 bytes, u64* bar) {
    asm volatile("{\n\t.reg .u64 g;\n\tcvta.to.global.u64 g, %1;\n\tcp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [g], %2, [%3];\n\t}" ::"r"(smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}

// One group of 16 rows: the matrix (planes P, M), its Q8 input (xq, xm) and output rows, and
// the group's index in the matrix.
struct GemvmJob {
    const u8* P;
    const u8* M;
    const i8* xq;
    const float2* xm;
    float* out;
    int n_out, blk;
    int mat = 0;  // which of a joined launch's matrices (q, k, v: the epilogue's choice)
};

// The epilogue of the q/k/v launch (gemvm3r_*, the fast path's gemv3r_*): RoPE of q's rows and,
// with rope_k, k's (adjacent pairs: rows 2i and 2i + 1 of a head, fold lanes l and l ^ 1), and
// the f16 KV-cache store of k (kd) and v (vd) at row slots[t] * n_out + r, with `rope_rot` and
// `f2h`: the rope and kv_store kernels' own arithmetic on the same values, so the same bits.
struct GemvmRope {
    const u32* pos;  // position of token t
    const float* ff;  // frequency factors (null: none)
    float theta_scale, freq_scale;
    int hd, rope_k;
    u16 *kd, *vd;  // null: not stored
    const u32* slots;
};

// The block walks row groups gi = blockIdx.x, blockIdx.x + gridDim.x, ... of NG (a grid of a
// few blocks per multiprocessor that stays resident: the copies of the next group stream while
// the fold finishes this one); `map(gi)` names a group's job. The rounds run on across groups
// (round kk: group kk / NR, its round kk % NR, both counted rather than divided: a runtime
// integer division is a long instruction sequence).
template <int QT, int NT, class Map, bool EP = false>
__device__ __forceinline__ void gemvm_run(const Map& map, int NG, int U, bool gdc, const GemvmRope ep = GemvmRope()) {
    using G = GemvmShape<QT, NT>;
    using PL = GemvmPlanes<QT>;
    constexpr int W = GEMVM_W, NB = G::NB;
    constexpr bool K = QT == QT_Q4_K || QT == QT_Q5_K;
    constexpr bool KQ = PL::K;  // super-block types: U % 8 == 0
    extern __shared__ __align__(16) float gsm[];
    u8* bufs = (u8*)(gsm + G::NS * G::SLOT);
    u64* full = (u64*)(bufs + NB * G::BUF);
    u64* empty = full + G::NS;
    u64* wfull = empty + G::NS;
    u64* wempty = wfull + NB;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int S = (U + 7) / 8;        // stages per row
    const int NR = (S + W - 1) / W;   // rounds per group
    const int first = blockIdx.x, step = gridDim.x;
    const int KK = (first < NG ? (NG - first + step - 1) / step : 0) * NR;  // this block's rounds
    // the meta plane and the activation scales by the copy engine where their rows are whole
    // 16-byte runs, else per lane from global memory
    const bool mbulk = !KQ && (U * PL::MSZ) % 16 == 0, xbulk = U % 2 == 0;
    if (tid == 0) {
        // the host's shared memory (src/matmul/mmq_order.rs `dims`) must cover this layout
        u32 dsm;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dsm));
        if (dsm < (u32)G::SMEM) __trap();
        for (int i = 0; i < G::NS; i++) {
            mbar_init(&full[i], W);     // a lane per compute warp arrives
            mbar_init(&empty[i], G::F);  // and per fold warp
        }
        for (int i = 0; i < NB; i++) {
            mbar_init(&wfull[i], 1);   // the copy warp's arrival, plus the bytes
            mbar_init(&wempty[i], W);  // a lane per compute warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == W + G::F) {
        // the copy warp: lane r < 16 copies row r's runs, lane 16 + t token t's activations
        // round kk's bytes of row r / token t: (weights, activations)
        auto issue = [&](int kk, const GemvmJob& job, int k, bool wts, bool act) {
            u8* buf = bufs + (kk % NB) * G::BUF;
            u64* bar = &wfull[kk % NB];
            const int nrows = min(GEMVM_ROWS, job.n_out - job.blk * GEMVM_ROWS);
            const int nu = min(GEMVM_RU, U - GEMVM_RU * k);  // units of the round (K: whole stages)
            const u32 pb = KQ ? (u32)(nu / 8) * PL::SB : (u32)nu * PL::PU, mb = mbulk ? (u32)nu * PL::MSZ : 0u, xb = (u32)nu * 32;
            const u32 sb = xbulk ? (u32)nu * 8 : 0u;
            const u32 bytes = (wts ? (u32)nrows * (pb + mb) : 0u) + (act ? NT * (xb + sb) : 0u);
            if (lane == 0) {
                if (act) mbar_arrive_tx(bar, bytes);
                else mbar_expect_tx(bar, bytes);
            }
            __syncwarp();
            if (wts && lane < nrows) {
                const u64 row = (u64)job.blk * GEMVM_ROWS + lane;
                if (KQ) {
                    bulk_copy(buf + lane * PL::RSP, job.P + (row * (U / 8) + W * k) * PL::SB, pb, bar);
                } else {
                    bulk_copy(buf + lane * PL::RSP, job.P + (row * U + GEMVM_RU * k) * PL::PU, pb, bar);
                    if (mbulk) bulk_copy(buf + GEMVM_ROWS * PL::RSP + lane * PL::RSM, job.M + (row * U + GEMVM_RU * k) * PL::MSZ, mb, bar);
                }
            }
            if (act && lane >= 16 && lane < 16 + NT) {
                const int t = lane - 16;
                u8* xbuf = buf + GEMVM_ROWS * (PL::RSP + PL::RSM);
                bulk_copy(xbuf + t * GEMVM_RU * 32, job.xq + ((u64)t * U + GEMVM_RU * k) * 32, xb, bar);
                if (xbulk) bulk_copy(xbuf + G::XB + t * GEMVM_RU * 8, job.xm + (u64)t * U + GEMVM_RU * k, sb, bar);
            }
        };
        const int P0 = min(NB, KK);
        // the first rounds' weights before the previous kernel's end, their activations after
        for (int kk = 0; kk < P0; kk++) issue(kk, map(first + kk / NR * step), kk % NR, true, !gdc);
        if (gdc) {
            GDC();
            for (int kk = 0; kk < P0; kk++) issue(kk, map(first + kk / NR * step), kk % NR, false, true);
        }
        int gn = P0 / NR, k = P0 % NR;
        GemvmJob job;
        if (P0 < KK) job = map(first + gn * step);
        for (int kk = P0; kk < KK; kk++) {
            mbar_wait(&wempty[kk % NB], (kk / NB - 1) & 1);
            issue(kk, job, k, true, true);
            if (++k == NR) {  // the next group's job (the map reads the routes: once per group)
                k = 0, gn++;
                if (kk + 1 < KK) job = map(first + gn * step);
            }
        }
        return;
    }
    if (gdc) GDC();
    if (warp < W) {
        const int r = lane / 2, h = lane % 2, g = lane / 4, tig = lane % 4;
        int gn = 0, k = 0;  // round kk's group (its place in the block's list) and round in it
        GemvmJob job;
        if (KK > 0) job = map(first);
        for (int kk = 0; kk < KK; kk++) {
            const int s = W * k + warp, slot = kk % G::NS, b = kk % NB;
            const u8* buf = bufs + b * G::BUF;
            // the round's activation scales: in the buffer (unit u of token t at t * RU + u), or global
            const float2* xmr = xbulk ? (const float2*)(buf + GEMVM_ROWS * (PL::RSP + PL::RSM) + G::XB) : job.xm + GEMVM_RU * k;
            const int xms = xbulk ? GEMVM_RU : U;  // its token stride
            float pr[NT][4];
            u32 p0 = 0u, p1 = 0u, b0 = 0u;
            float ofv = 0.f, xsv[(NT + 3) / 4];  // value lane + 32i: token (lane + 32i) / 8, unit % 8
            mbar_wait(&wfull[b], (kk / NB) & 1);
            if (s < S) {
#pragma unroll
                for (int i = 0; i < (NT + 3) / 4; i++) {
                    const int l = lane + 32 * i, t = l / 8, ku = 8 * s + l % 8;
                    xsv[i] = t < NT && (KQ || ku < U) ? xmr[t * xms + 8 * warp + l % 8].x : 0.f;
                }
                if (MMQ_OFS(QT) && g < NT) {
                    const int ka = 8 * s + 2 * tig, kb = ka + 1;
                    const float xa = ka < U ? xmr[g * xms + 8 * warp + 2 * tig].y : 0.f, xb = kb < U ? xmr[g * xms + 8 * warp + 2 * tig + 1].y : 0.f;
                    b0 = (u32)f2h(xa) | ((u32)f2h(xb) << 16);
                }
                // this lane's 4 units: k0 within the round, ke the round's units
                const int k0 = 8 * warp + 4 * h, ke = min(GEMVM_RU, U - GEMVM_RU * k);
                const u8* prow = buf + r * PL::RSP;
                Quad qd;
                if (KQ || mbulk) {
                    quad_load<QT>(qd, prow, buf + GEMVM_ROWS * PL::RSP + r * PL::RSM, 0, k0, ke, 0);
                } else {  // the meta plane from global memory (rows past the end re-read the last)
                    const u64 row = (u64)min(job.blk * GEMVM_ROWS + r, job.n_out - 1);
                    quad_load<QT>(qd, prow, job.M + (row * U + GEMVM_RU * k) * PL::MSZ, 0, k0, ke, 0);
                }
                const u8* xbuf = buf + GEMVM_ROWS * (PL::RSP + PL::RSM);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const Unit un = quad_unit<QT>(qd, j, h);
                    if (MMQ_OFS(QT)) {
                        const u32 hv = (u32)f2h(un.om);
                        if (j == 0) p0 = hv;
                        if (j == 1) p0 |= hv << 16;
                        if (j == 2) p1 = hv;
                        if (j == 3) p1 |= hv << 16;
                        if (j == 0) ofv = un.of;
                    }
                    // units past the row's end: zero weights and scales (quad_load), whatever
                    // the buffer holds there
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        const int4* xp = (const int4*)(xbuf + (t * GEMVM_RU + k0 + j) * 32);
                        const int4 xa = xp[0], xb = xp[1];
                        const int i0 = dp4a(un.q[3], xa.w, dp4a(un.q[2], xa.z, dp4a(un.q[1], xa.y, dp4a(un.q[0], xa.x, 0))));
                        const int i1 = dp4a(un.q[7], xb.w, dp4a(un.q[6], xb.z, dp4a(un.q[5], xb.y, dp4a(un.q[4], xb.x, 0))));
                        pr[t][j] = QT == QT_Q6_K ? __fadd_rn(__fmul_rn(un.s0, (float)i0), __fmul_rn(un.s1, (float)i1))
                                                 : __fmul_rn(un.s0, (float)(i0 + i1));
                    }
                }
            }
            // the warp's reads of the buffer are done (its values are in registers)
            __syncwarp();
            if (lane == 0) mbar_arrive(&wempty[b]);
            if (kk >= G::NS) mbar_wait(&empty[slot], (kk / G::NS - 1) & 1);
            if (s < S) {
                float* tp = gsm + slot * G::SLOT;
                float* cs = tp + G::TP;
                float* of = cs + G::CS;
                float* xs = of + G::OF;
#pragma unroll
                for (int i = 0; i < (NT + 3) / 4; i++)
                    if (lane + 32 * i < 8 * NT) xs[warp * NT * 8 + lane + 32 * i] = xsv[i];
#pragma unroll
                for (int t = 0; t < NT; t++)
                    *(float4*)&tp[(t * GEMVM_ROWS + r) * GEMVM_TPS + 8 * warp + 4 * h] = make_float4(pr[t][0], pr[t][1], pr[t][2], pr[t][3]);
                if (MMQ_OFS(QT)) {
                    // A: rows g / g + 8, unit pair tig of the stage, held by lanes 2g + tig / 2 (+ 16)
                    const int src = 2 * g + tig / 2;
                    const u32 x0 = __shfl_sync(0xffffffffu, p0, src), x1 = __shfl_sync(0xffffffffu, p1, src);
                    const u32 y0 = __shfl_sync(0xffffffffu, p0, src + 16), y1 = __shfl_sync(0xffffffffu, p1, src + 16);
                    float cv[4] = {0.f, 0.f, 0.f, 0.f};
                    mma_f16_k8(cv, (tig & 1) ? x1 : x0, (tig & 1) ? y1 : y0, b0);
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const int tok = 2 * tig + (i & 1);
                        if (tok < NT) cs[(warp * NT + tok) * GEMVM_ROWS + g + 8 * (i / 2)] = cv[i];
                    }
                    if (K && h == 0) of[warp * GEMVM_ROWS + r] = ofv;
                }
            }
            // the warp's stores, then one arrival for it (__syncwarp orders the lanes'
            // shared-memory writes before lane 0's release)
            __syncwarp();
            if (lane == 0) mbar_arrive(&full[slot]);
            if (++k == NR) {
                k = 0, gn++;
                if (kk + 1 < KK) job = map(first + gn * step);
            }
        }
    } else {
        const int ti = tid - 32 * W, fr = ti % GEMVM_ROWS, ft = ti / GEMVM_ROWS;  // fold thread (row, token)
        float acc = 0.f;
        int gn = 0, k = 0;  // counted as the compute warps'
        GemvmJob job;
        if (KK > 0) job = map(first);
        for (int kk = 0; kk < KK; kk++) {
            const int slot = kk % G::NS;
            mbar_wait(&full[slot], (kk / G::NS) & 1);
            if (ft < NT) {
                const float* tp = gsm + slot * G::SLOT + (ft * GEMVM_ROWS + fr) * GEMVM_TPS;
                const float* cs = gsm + slot * G::SLOT + G::TP;
                const float* of = cs + G::CS;
                const float* xs = of + G::OF + ft * 8;  // the token's unit scales, stage st at + st * NT * 8
#pragma unroll
                for (int st = 0; st < W; st++) {
                    const int s = W * k + st;
                    if (s >= S) break;
                    const float4 a = *(const float4*)&tp[8 * st], b = *(const float4*)&tp[8 * st + 4];
                    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                    const float4 xa = *(const float4*)&xs[st * NT * 8], xb = *(const float4*)&xs[st * NT * 8 + 4];
                    const float xd[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
                    for (int u = 0; u < 8; u++) {
                        if (KQ || 8 * s + u < U) acc = fmaf(xd[u], v[u], acc);
                    }
                    if (MMQ_OFS(QT)) {
                        const float c = cs[(st * NT + ft) * GEMVM_ROWS + fr];
                        acc = K ? fmaf(of[st * GEMVM_ROWS + fr], c, acc) : __fadd_rn(acc, c);
                    }
                }
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[slot]);
            if (++k == NR) {  // the group's chains are complete
                const int row = job.blk * GEMVM_ROWS + fr;
                if (EP) {
                    // the pair's other row (lane ^ 1: rows fr ^ 1 of the same token); every
                    // lane of the warp takes part
                    const float other = __shfl_xor_sync(0xffffffffu, acc, 1);
                    if (ft < NT && row < job.n_out) {
                        float y = acc;
                        if (job.mat == 0 || (job.mat == 1 && ep.rope_k)) {
                            const bool odd = fr & 1;
                            float y0, y1;
                            rope_rot(odd ? other : acc, odd ? acc : other, ep.pos[ft], ep.ff, (row % ep.hd) / 2, ep.theta_scale, ep.freq_scale, &y0, &y1);
                            y = odd ? y1 : y0;
                        }
                        job.out[(u64)ft * job.n_out + row] = y;
                        u16* c = job.mat == 1 ? ep.kd : (job.mat == 2 ? ep.vd : nullptr);
                        if (c) c[(u64)ep.slots[ft] * job.n_out + row] = f2h(y);
                    }
                } else if (ft < NT && row < job.n_out) {
                    job.out[(u64)ft * job.n_out + row] = acc;
                }
                acc = 0.f;
                k = 0;
                gn++;
                if (kk + 1 < KK) job = map(first + gn * step);
            }
        }
    }
}

// Jobs of one matrix.
struct GemvmOne {
    GemvmJob job;  // its blk unused
    __device__ GemvmJob operator()(int gi) const {
        GemvmJob j = job;
        j.blk = gi;
        return j;
    }
};

// Jobs of two or three matrices over the same input: groups [0, b0) of matrix 0, [b0, b0 + b1)
// of matrix 1, the rest of matrix 2.
struct GemvmThree {
    const u8 *P0, *P1, *P2, *M0, *M1, *M2;
    float *out0, *out1, *out2;
    int n0, n1, n2, b0, b1;
    const i8* xq;
    const float2* xm;
    __device__ GemvmJob operator()(int gi) const {
        if (gi < b0) return {P0, M0, xq, xm, out0, n0, gi, 0};
        if (gi < b0 + b1) return {P1, M1, xq, xm, out1, n1, gi - b0, 1};
        return {P2, M2, xq, xm, out2, n2, gi - b0 - b1, 2};
    }
};

// n / d for 0 <= n < 2^31 by a multiply and a shift (d >= 1 set up once: Granlund-Montgomery):
// the maps run every round, and a runtime integer division is a long instruction sequence.
struct FastDiv {
    u32 d, m, l;
    __device__ explicit FastDiv(u32 d_) : d(d_), l(0) {
        while ((1u << l) < d) l++;
        m = (u32)(((1ull << 32) * ((1ull << l) - d)) / d + 1);
    }
    __device__ u32 div(u32 n) const { return (__umulhi(n, m) + n) >> l; }
};

// Routed experts over device routes: group gi of route j = (gi / groups) % n_routes, matrix
// gi / (groups · n_routes) (gate, up), expert eids[j], input row j / n_used (per token) or j;
// groups from moe_g on: a dense matrix over the same input row 0 (a shared expert's up
// projection of a one-token step: planes PS / MS, nS rows into outS).
struct GemvmMoe {
    const u8 *P0, *P1, *M0, *M1;
    float *out0, *out1;
    u64 slice_p, slice_m;
    const u32* eids;
    int n_used, per_token, groups, n_routes, U, n_out;
    const i8* xq;
    const float2* xm;
    FastDiv by_groups, by_used;
    const u8 *PS, *MS;
    float* outS;
    int nS, moe_g;
    __device__ GemvmJob operator()(int gi) const {
        if (gi >= moe_g) return {PS, MS, xq, xm, outS, nS, gi - moe_g};
        const u32 q = by_groups.div((u32)gi);  // route-major index over both matrices
        const bool z = (int)q >= n_routes;
        const int j = (int)q - (z ? n_routes : 0);
        const u64 e = eids[j], x = per_token ? by_used.div((u32)j) : (u32)j;
        const u8* M = z ? M1 : M0;
        return {(z ? P1 : P0) + e * slice_p, M ? M + e * slice_m : M, xq + x * U * 32, xm + x * U, (z ? out1 : out0) + (u64)j * n_out,
                n_out, gi - (int)q * groups};
    }
};

// out (NT, n_out) = x · Wᵀ over NT tokens (x as Q8 units), blockIdx.y: chunk of NT tokens;
// gridDim.x blocks walk the ceil(n_out / 16) row groups.
#define GEMVM(NAME, QT, NT)                                                                                             \
    extern "C" __global__ void __launch_bounds__(GemvmShape<QT, NT>::THREADS, GemvmShape<QT, NT>::MIN_BLOCKS) gemvm_##NAME##_##NT( \
        const u8* __restrict__ P, const u8* __restrict__ M, const i8* __restrict__ xq, const float2* __restrict__ xm,     \
        float* __restrict__ out, int U, int n_out) {                                                                    \
        const u64 c = blockIdx.y;                                                                                       \
        const GemvmOne map{{P, M, xq + c * NT * U * 32, xm + c * NT * U, out + c * NT * n_out, n_out, 0}};           \
        gemvm_run<QT, NT>(map, (n_out + GEMVM_ROWS - 1) / GEMVM_ROWS, U, true);                                         \
    }
// Two or three matrices over the same input in one launch (q/k/v, gate/up): row groups [0, b0)
// of matrix 0, [b0, b0 + b1) of matrix 1, the rest of matrix 2 (n2 = 0: two matrices). Each
// group's rows are its own launch's, bit for bit (a group's sums never depend on the grid).
#define GEMVM3(NAME, QT, NT)                                                                                            \
    extern "C" __global__ void __launch_bounds__(GemvmShape<QT, NT>::THREADS, GemvmShape<QT, NT>::MIN_BLOCKS)                   \
        gemvm3_##NAME##_##NT(const u8* __restrict__ P0, const u8* __restrict__ M0, float* __restrict__ out0, int n0, int b0, \
                             const u8* __restrict__ P1, const u8* __restrict__ M1, float* __restrict__ out1, int n1, int b1, \
                             const u8* __restrict__ P2, const u8* __restrict__ M2, float* __restrict__ out2, int n2,     \
                             const i8* __restrict__ xq, const float2* __restrict__ xm, int U) {                          \
        const GemvmThree map{P0, P1, P2, M0, M1, M2, out0, out1, out2, n0, n1, n2, b0, b1, xq, xm};               \
        gemvm_run<QT, NT>(map, b0 + b1 + (n2 + GEMVM_ROWS - 1) / GEMVM_ROWS, U, true);                                  \
    }
// gemvm3r_*: gemvm3_* over q, k, v with RoPE and the KV-cache store in the fold's epilogue
// (GemvmRope): q rotated; k rotated when rope_k, stored to kd when set; v stored to vd when set
// (f16 caches, rows of n1 = n2 values per slot). Rows are whole rope pairs: heads of even size.
#define GEMVM3R(NAME, QT, NT)                                                                                           \
    extern "C" __global__ void __launch_bounds__(GemvmShape<QT, NT>::THREADS, GemvmShape<QT, NT>::MIN_BLOCKS)           \
        gemvm3r_##NAME##_##NT(const u8* __restrict__ P0, const u8* __restrict__ M0, float* __restrict__ out0, int n0, int b0, \
                              const u8* __restrict__ P1, const u8* __restrict__ M1, float* __restrict__ out1, int n1, int b1, \
                              const u8* __restrict__ P2, const u8* __restrict__ M2, float* __restrict__ out2, int n2,    \
                              const i8* __restrict__ xq, const float2* __restrict__ xm, int U, const u32* pos, const float* ff, \
                              float theta_scale, float freq_scale, int hd, int rope_k, u16* kd, u16* vd, const u32* slots) { \
        const GemvmThree map{P0, P1, P2, M0, M1, M2, out0, out1, out2, n0, n1, n2, b0, b1, xq, xm};               \
        const GemvmRope ep{pos, ff, theta_scale, freq_scale, hd, rope_k, kd, vd, slots};                          \
        gemvm_run<QT, NT, GemvmThree, true>(map, b0 + b1 + (n2 + GEMVM_ROWS - 1) / GEMVM_ROWS, U, true, ep);           \
    }
// Routed experts with the routes on the device (moe_route): route j, expert eids[j] at P +
// eid * slice_p (M + eid * slice_m), input row j / n_used (x per token) or j; a second matrix
// of one shape over the same input (gate and up) where P1 is not null. `early`: the routes were
// written at least two launches back (the kernel right before waited for them: complete and
// visible), so the first rounds' expert weights are asked for before the PDL wait, as the dense
// kernels' are (the down projection: its weights stream while the activation kernel runs).
#define MOE_GEMVM_DEV(NAME, QT)                                                                                         \
    extern "C" __global__ void __launch_bounds__(GemvmShape<QT, 1>::THREADS, GemvmShape<QT, 1>::MIN_BLOCKS) moe_gemvm_dev_##NAME( \
        const u8* __restrict__ P0, const u8* __restrict__ M0, float* __restrict__ out0, const u8* __restrict__ P1,        \
        const u8* __restrict__ M1, float* __restrict__ out1, u64 slice_p, u64 slice_m, const u32* __restrict__ eids,     \
        int n_used, int per_token, const i8* __restrict__ xq, const float2* __restrict__ xm, int U, int n_out,             \
        int n_routes, int early, const u8* __restrict__ PS, const u8* __restrict__ MS, float* __restrict__ outS, int nS) { \
        if (!early) GDC();                                                                                              \
        const int groups = (n_out + GEMVM_ROWS - 1) / GEMVM_ROWS, moe_g = groups * n_routes * (P1 ? 2 : 1);          \
        const GemvmMoe map{P0, P1, M0, M1, out0, out1, slice_p, slice_m, eids, n_used, per_token, groups, n_routes, U, n_out, xq, xm, \
                           FastDiv((u32)groups), FastDiv((u32)max(n_used, 1)), PS, MS, outS, nS, moe_g};                 \
        gemvm_run<QT, 1>(map, moe_g + (nS + GEMVM_ROWS - 1) / GEMVM_ROWS, U, early != 0);                              \
    }
#define GEMVM_ALL(NAME, QT)                                                                          \
    GEMVM(NAME, QT, 1) GEMVM(NAME, QT, 2) GEMVM(NAME, QT, 4) GEMVM(NAME, QT, 8) GEMVM3(NAME, QT, 1) GEMVM3(NAME, QT, 2) \
        GEMVM3(NAME, QT, 4) GEMVM3(NAME, QT, 8) GEMVM3R(NAME, QT, 1) GEMVM3R(NAME, QT, 2) GEMVM3R(NAME, QT, 4)        \
        GEMVM3R(NAME, QT, 8) MOE_GEMVM_DEV(NAME, QT)
GEMVM_ALL(q4_0, QT_Q4_0)
GEMVM_ALL(q4_1, QT_Q4_1)
GEMVM_ALL(q5_0, QT_Q5_0)
GEMVM_ALL(q5_1, QT_Q5_1)
GEMVM_ALL(q8_0, QT_Q8_0)
GEMVM_ALL(q4_K, QT_Q4_K)
GEMVM_ALL(q5_K, QT_Q5_K)
GEMVM_ALL(q6_K, QT_Q6_K)
