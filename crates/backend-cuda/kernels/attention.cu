// Paged causal attention, flash style: one warp per (query tile, head, position split).
// A tile holds up to ATT_QT consecutive tokens of one sequence; the warp walks its split's
// positions 32 at a time (K/V rows gathered through the block table into shared memory as
// f32), keeps an online softmax per query, and writes a partial (m, l, acc). `attn_combine`
// merges the splits (split-K over long contexts).
//
// Two numeric flavours, as the CPU backend (after ggml's CPU flash attention):
// - `vec` (q16 != 0: f16 cache, short sequences): ggml's vector path. q rounded to f16, scores
//   in `ggml_vec_dot_f16`'s AVX-512 summation order (`dot_ggml`), and the softmax folded in
//   position by position with the V accumulator rounded to f16 after every update
//   (`ggml_vec_scale_f16` / `ggml_vec_mad_f16`: f32 FMA, f16 storage). The running maximum
//   each position sees is an exclusive prefix max over the 32 scores (a warp scan), so every
//   lane computes its own position's exp once and the sequential part is two shuffles, an FMA
//   and the f16 rounding per value.
// - otherwise all f32, the softmax folded in once per 32 positions.

#define ATT_QT 8

template <int KT>
__device__ __forceinline__ float kv_load(const u8* __restrict__ p, u64 e) {
    if (KT == KV_F32) return ((const float*)p)[e];
    if (KT == KV_F16) return h2f(((const u16*)p)[e]);
    u64 b = e / 32;
    int i = (int)(e % 32);
    if (KT == KV_Q8_0) {
        const u8* blk = p + b * 34;
        return h2f(*(const u16*)blk) * (float)(i8)blk[2 + i];
    }
    const u8* blk = p + b * 18;
    u8 byte = blk[2 + (i % 16)];
    int q = i < 16 ? (byte & 0xF) : (byte >> 4);
    return h2f(*(const u16*)blk) * (float)(q - 8);
}

// The normalized Walsh-Hadamard transform of every rot-block of X[0..hd) (one warp, shared
// memory): quarrel_quant::rotate::hadamard's butterflies in its order, then the scaling.
__device__ __forceinline__ void hadamard_row(float* X, int hd, int rot, int lane) {
    for (int h = 1; h < rot; h <<= 1) {
        for (int p = lane; p < hd / 2; p += 32) {
            int j = (p / h) * 2 * h + p % h;
            float a = X[j], b = X[j + h];
            X[j] = __fadd_rn(a, b);
            X[j + h] = __fsub_rn(a, b);
        }
        __syncwarp();
    }
    const float nrm = __fdiv_rn(1.0f, sqrtf((float)rot));
    for (int d = lane; d < hd; d += 32) X[d] = __fmul_rn(X[d], nrm);
    __syncwarp();
}

// Rows base..base+nr-1 of one KV head as f32 into Ks / Vs ([32][hd + 1]): lane r loads row r.
// f16 / f32 caches with hd a multiple of 8 / 4 take 16-byte loads, all in flight together.
template <int KT>
__device__ __forceinline__ void load_rows(const u8* __restrict__ K, const u8* __restrict__ V, float* Ks, float* Vs, const u32* __restrict__ table,
                                          int bs, u64 row, int kvh, int hd, int base, int nr, int lane, int rot,
                                          const float* __restrict__ koff) {
    if ((KT == KV_F16 && hd % 8 == 0) || (KT == KV_F32 && hd % 4 == 0)) {
        if (lane < nr) {
            int p = base + lane;
            u64 e0 = ((u64)table[p / bs] * bs + p % bs) * row + (u64)kvh * hd;
            float* ko = Ks + lane * (hd + 1);
            float* vo = Vs + lane * (hd + 1);
            if (KT == KV_F16) {
                const uint4* kr = (const uint4*)(K + e0 * 2);
                const uint4* vr = (const uint4*)(V + e0 * 2);
#pragma unroll 8
                for (int j = 0; j < hd / 8; j++) {
                    uint4 a = kr[j], b = vr[j];
                    u32 aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        ko[8 * j + 2 * i] = h2f((u16)(aw[i] & 0xffff));
                        ko[8 * j + 2 * i + 1] = h2f((u16)(aw[i] >> 16));
                        vo[8 * j + 2 * i] = h2f((u16)(bw[i] & 0xffff));
                        vo[8 * j + 2 * i + 1] = h2f((u16)(bw[i] >> 16));
                    }
                }
            } else {
                const float4* kr = (const float4*)(K + e0 * 4);
                const float4* vr = (const float4*)(V + e0 * 4);
#pragma unroll 4
                for (int j = 0; j < hd / 4; j++) {
                    float4 a = kr[j], b = vr[j];
                    ko[4 * j] = a.x; ko[4 * j + 1] = a.y; ko[4 * j + 2] = a.z; ko[4 * j + 3] = a.w;
                    vo[4 * j] = b.x; vo[4 * j + 1] = b.y; vo[4 * j + 2] = b.z; vo[4 * j + 3] = b.w;
                }
            }
        }
    } else {
        for (int r = 0; r < nr; r++) {
            int p = base + r;
            u64 e0 = ((u64)table[p / bs] * bs + p % bs) * row + (u64)kvh * hd;
            for (int d = lane; d < hd; d += 32) {
                Ks[r * (hd + 1) + d] = kv_load<KT>(K, e0 + d);
                Vs[r * (hd + 1) + d] = kv_load<KT>(V, e0 + d);
            }
        }
        if (KT == KV_Q8_0 || KT == KV_Q4_0) {
            // quantized rows are stored Hadamard-rotated in blocks of rot (kv_put): rotate back
            // (H is its own inverse), in the CPU's order of operations
            __syncwarp();
            for (int r = 0; r < nr; r++) {
                hadamard_row(Ks + r * (hd + 1), hd, rot, lane);
                hadamard_row(Vs + r * (hd + 1), hd, rot, lane);
            }
            // keys were stored less the layer's key offset (kv_put): add it back
            if (koff) {
                __syncwarp();
                for (int r = 0; r < nr; r++)
                    for (int d = lane; d < hd; d += 32) Ks[r * (hd + 1) + d] = __fadd_rn(Ks[r * (hd + 1) + d], koff[(u64)kvh * hd + d]);
            }
        }
    }
}

// q·k as `ggml_vec_dot_f16` sums it in ggml's AVX-512 build (the CPU backend's
// `dot_f16_ggml`): 64 FMA accumulators (4 x 16 lanes) over 64-value steps, folded pairwise
// (0+2, 1+3, then together), the 16 lanes reduced as a tree (8, 4, 2+2), and the values past
// the last whole step added in f64.
__device__ __forceinline__ float dot_ggml(const float* __restrict__ q, const float* __restrict__ k, int hd) {
    const int np = hd & ~63;
    float x[16];
#pragma unroll
    for (int l = 0; l < 16; l++) {
        float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
        for (int i = 0; i < np; i += 64) {
            a0 = __fmaf_rn(q[i + l], k[i + l], a0);
            a1 = __fmaf_rn(q[i + 16 + l], k[i + 16 + l], a1);
            a2 = __fmaf_rn(q[i + 32 + l], k[i + 32 + l], a2);
            a3 = __fmaf_rn(q[i + 48 + l], k[i + 48 + l], a3);
        }
        x[l] = __fadd_rn(__fadd_rn(a0, a2), __fadd_rn(a1, a3));
    }
#pragma unroll
    for (int l = 0; l < 8; l++) x[l] = __fadd_rn(x[l], x[l + 8]);
#pragma unroll
    for (int l = 0; l < 4; l++) x[l] = __fadd_rn(x[l], x[l + 4]);
    double sum = (double)__fadd_rn(__fadd_rn(x[0], x[2]), __fadd_rn(x[1], x[3]));
    for (int i = np; i < hd; i++) sum += (double)__fmul_rn(q[i], k[i]);
    return (float)sum;
}

__device__ __forceinline__ float r16(float x) { return h2f(f2h(x)); }

// Query i's score s[i] of this lane's position p as `sc`: scaled and soft-capped (each product
// rounded on its own), -INF where masked (`valid` false: past the run of nr positions, after
// the query's position pq, before its window). A macro, not a function: both score paths of
// attn_part then compile exactly as written out.
#define TILE_LOGIT(i)                                                                    \
    int pq = (int)pos[t0 + (i)];                                                         \
    int lq = window > 0 ? max(0, pq + 1 - window) : 0;                                   \
    bool valid = lane < nr && p <= pq && p >= lq;                                        \
    float sc = __fmul_rn(s[(i)], scale);                                                 \
    if (softcap > 0.f) sc = __fmul_rn(softcap, tanhf(__fdiv_rn(sc, softcap)));           \
    sc = valid ? sc : -INF;

// meta: tiles (t0, nq, seq) x n_tiles; pos per token; bt_off per sequence; bt (block tables).
// part: per (token, head, split): [m, l, acc[hd]]. The warp's queries are the tile's tokens
// t0 .. t0 + nq - 1 for head blockIdx.y.
template <int KT, int DPL, int QT>
__device__ __forceinline__ void attn_part(const float* __restrict__ q, const u8* __restrict__ K, const u8* __restrict__ V,
                                          float* __restrict__ part, const u32* __restrict__ tiles, const u32* __restrict__ pos,
                                          const u32* __restrict__ bt_off, const u32* __restrict__ bt, int n_head, int n_kv_head,
                                          int hd, int bs, float scale, float softcap, int window, int rot, int q16,
                                          const float* __restrict__ koff) {
    GDC();
    extern __shared__ float sm[];
    const int lane = threadIdx.x;
    const int tile = blockIdx.x, h = blockIdx.y, split = blockIdx.z, n_split = gridDim.z;
    const u32 t0 = tiles[3 * tile], seq = tiles[3 * tile + 2];
    const u32 nq = tiles[3 * tile + 1];
    const int kvh = h / (n_head / n_kv_head);
    const bool vec = KT == KV_F16 && q16;
    float* Qs = sm;                    // [QT][hd]
    float* Ks = Qs + QT * hd;      // [32][hd + 1]
    float* Vs = Ks + 32 * (hd + 1);    // [32][hd + 1]
    int hi = 0, lo = 0x7fffffff;
    for (u32 i = 0; i < nq; i++) {
        int p = (int)pos[t0 + i];
        hi = max(hi, p);
        lo = min(lo, window > 0 ? max(0, p + 1 - window) : 0);
    }
    // q16: q rounded to f16 first, as the CPU's (ggml's) f16 vector path for short sequences does
    for (u32 i = lane; i < nq * hd; i += 32) {
        float qv = q[((u64)(t0 + i / hd) * n_head + (u32)h) * hd + i % hd];
        Qs[i] = KT == KV_F16 && q16 ? h2f(f2h(qv)) : qv;
    }
    // this split's share of the tile's positions, in whole runs of 32
    const int split_len = ((hi + 1 - lo + n_split - 1) / n_split + 31) / 32 * 32;
    const int p_begin = lo + split * split_len;
    const int p_end = min(hi + 1, p_begin + split_len);
    float m[QT], l[QT], acc[QT][DPL];
    softmax_init(m, l, acc);
    const u64 row = (u64)n_kv_head * hd;
    const u32* table = bt + bt_off[seq];
    __syncwarp();
    for (int base = p_begin; base < p_end; base += 32) {
        int nr = min(32, p_end - base);
        load_rows<KT>(K, V, Ks, Vs, table, bs, row, kvh, hd, base, nr, lane, rot, koff);
        __syncwarp();
        const int p = base + lane;
        float s[QT];
#pragma unroll
        for (int i = 0; i < QT; i++) s[i] = 0.f;
        if (lane < nr) {
            if (vec) {
#pragma unroll
                for (int i = 0; i < QT; i++)
                    if (i < nq) s[i] = dot_ggml(Qs + i * hd, Ks + lane * (hd + 1), hd);
            } else {
                for (int d = 0; d < hd; d++) {
                    float k = Ks[lane * (hd + 1) + d];
#pragma unroll
                    for (int i = 0; i < QT; i++)
                        if (i < nq) s[i] += Qs[i * hd + d] * k;
                }
            }
        }
        if (vec) {
            // ggml's vector path: per query, the maximum position j sees is m and the scores
            // before j (an exclusive prefix max over the lanes); a new maximum rescales the
            // accumulator by ms and adds v with weight 1, otherwise v is added with weight
            // exp(score - m); masked positions (and queries past nq) add nothing (w = 0, ms = 1)
            float msv[QT], wv[QT];
            bool anynew = false;
#pragma unroll
            for (int i = 0; i < QT; i++) {
                msv[i] = 1.f;
                wv[i] = 0.f;
                if (i >= nq) continue;
                TILE_LOGIT(i)
                float x = sc;
#pragma unroll
                for (int o = 1; o < 32; o <<= 1) {
                    float y = __shfl_up_sync(0xffffffffu, x, o);
                    if (lane >= o) x = fmaxf(x, y);
                }
                float ex = __shfl_up_sync(0xffffffffu, x, 1);
                ex = fmaxf(lane == 0 ? -INF : ex, m[i]);
                // exp correctly rounded (through f64), as glibc's expf, which ggml calls, nearly always is
                if (valid) {
                    if (sc > ex) {
                        msv[i] = (float)exp((double)__fsub_rn(ex, sc));
                        wv[i] = 1.f;
                        anynew = true;
                    } else {
                        wv[i] = (float)exp((double)__fsub_rn(sc, ex));
                    }
                }
                m[i] = fmaxf(m[i], __shfl_sync(0xffffffffu, x, 31));
            }
            if (__any_sync(0xffffffffu, anynew)) {
                for (int j = 0; j < nr; j++) {
#pragma unroll
                    for (int i = 0; i < QT; i++) {
                        float msj = __shfl_sync(0xffffffffu, msv[i], j), wj = __shfl_sync(0xffffffffu, wv[i], j);
                        if (msj != 1.f) {
#pragma unroll
                            for (int d = 0; d < DPL; d++) acc[i][d] = r16(__fmul_rn(acc[i][d], msj));
                        }
#pragma unroll
                        for (int d = 0; d < DPL; d++) {
                            int dd = lane + 32 * d;
                            if (dd < hd) acc[i][d] = r16(__fmaf_rn(Vs[j * (hd + 1) + dd], wj, acc[i][d]));
                        }
                        l[i] = __fmaf_rn(l[i], msj, wj);
                    }
                }
            } else {
                // no new maximum in these 32 positions (the usual case): straight-line updates,
                // the queries' chains interleaved (l·1 + w is the FMA's value)
                for (int j = 0; j < nr; j++) {
#pragma unroll
                    for (int i = 0; i < QT; i++) {
                        float wj = __shfl_sync(0xffffffffu, wv[i], j);
#pragma unroll
                        for (int d = 0; d < DPL; d++) {
                            int dd = lane + 32 * d;
                            if (dd < hd) acc[i][d] = r16(__fmaf_rn(Vs[j * (hd + 1) + dd], wj, acc[i][d]));
                        }
                        l[i] = __fadd_rn(l[i], wj);
                    }
                }
            }
            __syncwarp();
            continue;
        }
#pragma unroll
        for (int i = 0; i < QT; i++) {
            if (i >= nq) break;
            TILE_LOGIT(i)
            float tmax = warp_max(sc);
            if (tmax == -INF) continue;
            float mn = fmaxf(m[i], tmax);
            float pj = valid ? expf(sc - mn) : 0.f;
            float corr = expf(m[i] - mn);
            l[i] = l[i] * corr + warp_sum(pj);
#pragma unroll
            for (int d = 0; d < DPL; d++) acc[i][d] *= corr;
            for (int j = 0; j < nr; j++) {
                float pb = __shfl_sync(0xffffffffu, pj, j);
#pragma unroll
                for (int d = 0; d < DPL; d++) {
                    int dd = lane + 32 * d;
                    if (dd < hd) acc[i][d] += pb * Vs[j * (hd + 1) + dd];
                }
            }
            m[i] = mn;
        }
        __syncwarp();
    }
#pragma unroll
    for (int i = 0; i < QT; i++) {
        if (i >= nq) break;
        float* o = part + (((u64)(t0 + i) * n_head + h) * n_split + split) * (hd + 2);
        if (lane == 0) {
            o[0] = m[i];
            o[1] = l[i];
        }
#pragma unroll
        for (int d = 0; d < DPL; d++) {
            int dd = lane + 32 * d;
            if (dd < hd) o[2 + dd] = acc[i][d];
        }
    }
}

#undef TILE_LOGIT

// attn_*: tiles of up to ATT_QT query tokens; attn1_*: one query token per tile (decode).
#define ATTN_ARGS                                                                                                  \
    const float *q, const u8 *K, const u8 *V, float *part, const u32 *tiles, const u32 *pos, const u32 *bt_off,     \
        const u32 *bt, int n_head, int n_kv_head, int hd, int bs, float scale, float softcap, int window, int rot, int q16, \
        const float *koff
#define ATTN_PASS q, K, V, part, tiles, pos, bt_off, bt, n_head, n_kv_head, hd, bs, scale, softcap, window, rot, q16, koff
#define ATTN(NAME, KT, DPL)                                                                                          \
    extern "C" __global__ void __launch_bounds__(32) attn_##NAME##_##DPL(ATTN_ARGS) {                              \
        attn_part<KT, DPL, ATT_QT>(ATTN_PASS);                                                                       \
    }                                                                                                                \
    extern "C" __global__ void __launch_bounds__(32) attn1_##NAME##_##DPL(ATTN_ARGS) { attn_part<KT, DPL, 1>(ATTN_PASS); }
// ATTN_DPL (src/kernels.rs): only one DPL's kernels in this unit
#if !defined(ATTN_DPL) || ATTN_DPL == 2
#define ATTN_2(NAME, KT) ATTN(NAME, KT, 2)
#else
#define ATTN_2(NAME, KT)
#endif
#if !defined(ATTN_DPL) || ATTN_DPL == 4
#define ATTN_4(NAME, KT) ATTN(NAME, KT, 4)
#else
#define ATTN_4(NAME, KT)
#endif
#if !defined(ATTN_DPL) || ATTN_DPL == 8
#define ATTN_8(NAME, KT) ATTN(NAME, KT, 8)
#else
#define ATTN_8(NAME, KT)
#endif
#define ATTN_ALL(NAME, KT) ATTN_2(NAME, KT) ATTN_4(NAME, KT) ATTN_8(NAME, KT)
// ATTN_KV (src/kernels.rs): only one KV type's kernels in this unit (the units compile in
// parallel; these templates are the slowest part of the whole build)
#if !defined(ATTN_KV) || ATTN_KV == KV_F32
ATTN_ALL(f32, KV_F32)
#endif
#if !defined(ATTN_KV) || ATTN_KV == KV_F16
ATTN_ALL(f16, KV_F16)
#endif
#if !defined(ATTN_KV) || ATTN_KV == KV_Q8_0
ATTN_ALL(q8_0, KV_Q8_0)
#endif
#if !defined(ATTN_KV) || ATTN_KV == KV_Q4_0
ATTN_ALL(q4_0, KV_Q4_0)
#endif

// One block per (token, head): merge the splits' partials into out (n_tok, n_head, hd).
// xq/xm non-null (blockDim == hd, a multiple of 32): the output is also written as Q8.
// sinks non-null: one logit per head that joins the softmax's denominator and attends to
// nothing (a split with m = sink, l = 1 and no values).
extern "C" __global__ void attn_combine(const float* __restrict__ part, float* __restrict__ out, int n_head, int hd, int n_split,
                                        i8* __restrict__ xq, float2* __restrict__ xm, const float* __restrict__ sinks) {
    GDC();
    u64 th = blockIdx.x;
    const float* p = part + th * n_split * (hd + 2);
    float M = -INF;
    for (int s = 0; s < n_split; s++) M = fmaxf(M, p[s * (hd + 2)]);
    const float sink = sinks ? sinks[th % n_head] : -INF;
    M = fmaxf(M, sink);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float L = sinks ? expf(sink - M) : 0.f, O = 0.f;
        for (int s = 0; s < n_split; s++) {
            const float* ps = p + s * (hd + 2);
            if (ps[0] == -INF) continue;
            float w = expf(ps[0] - M);
            L += ps[1] * w;
            O += ps[2 + d] * w;
        }
        // times the reciprocal, as the CPU backend normalizes
        float o = L > 0.f ? __fmul_rn(O, __fdiv_rn(1.f, L)) : 0.f;
        out[th * hd + d] = o;
        if (xq) q8_store(o, xq, xm, (th * hd + d) / 32);
    }
}
