// Batched decode attention for grouped-query heads: one warp per (sequence, KV head, position split) serves the G query heads that
// share the KV head, so each K/V row of the paged cache is read once for all of them
// (attn1_* reads it once per query head and stages it through shared memory). Lane j of a run
// of 32 positions reads K row base + j straight from the cache (16-byte loads) and scores it
// against the G queries; V rows are read across the warp, lane l holding dims DPL·l ..
// DPL·l + DPL - 1. Per query head the arithmetic is attn_part's with one query per tile
// (scores summed over d in order, online softmax per run of 32, P·V over the run in order),
// and the partials have its layout, so attn_combine merges the splits. f32 / f16 caches with
// head_dim == 32·DPL; up to GM query heads per KV head.

template <int KT, int DPL>
__device__ __forceinline__ void kv_vec(const u8* __restrict__ p, u64 e, float (&v)[DPL]) {
    if (KT == KV_F16) {
        if (DPL == 2) {
            u32 w = *(const u32*)(p + e * 2);
            v[0] = h2f((u16)(w & 0xffff));
            v[1] = h2f((u16)(w >> 16));
        } else if (DPL == 4) {
            uint2 w = *(const uint2*)(p + e * 2);
            u32 a[2] = {w.x, w.y};
#pragma unroll
            for (int i = 0; i < 2; i++) {
                v[2 * i] = h2f((u16)(a[i] & 0xffff));
                v[2 * i + 1] = h2f((u16)(a[i] >> 16));
            }
        } else {
            uint4 w = *(const uint4*)(p + e * 2);
            u32 a[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                v[2 * i] = h2f((u16)(a[i] & 0xffff));
                v[2 * i + 1] = h2f((u16)(a[i] >> 16));
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < DPL; i += 2) {
            float2 w = *(const float2*)(p + (e + i) * 4);
            v[i] = w.x;
            v[i + 1] = w.y;
        }
    }
}

template <int KT, int DPL, int GM>
__device__ __forceinline__ void attn_gqa(const float* __restrict__ q, const u8* __restrict__ K, const u8* __restrict__ V,
                                         float* __restrict__ part, const u32* __restrict__ tiles, const u32* __restrict__ pos,
                                         const u32* __restrict__ bt_off, const u32* __restrict__ bt, int n_head, int n_kv_head,
                                         int hd, int bs, float scale, float softcap, int window, int q16) {
    extern __shared__ float sm[];
    float* Qs = sm;  // [G][hd]
    const int lane = threadIdx.x;
    const int tile = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z, n_split = gridDim.z;
    const u32 t0 = tiles[3 * tile], seq = tiles[3 * tile + 2];
    const int G = n_head / n_kv_head;
    const int pq = (int)pos[t0];
    const int lo = window > 0 ? max(0, pq + 1 - window) : 0;
    for (int i = lane; i < G * hd; i += 32) {
        float qv = q[((u64)t0 * n_head + kvh * G + i / hd) * hd + i % hd];
        Qs[i] = KT == KV_F16 && q16 ? h2f(f2h(qv)) : qv;
    }
    __syncwarp();
    const int split_len = ((pq + 1 - lo + n_split - 1) / n_split + 31) / 32 * 32;
    const int p_begin = lo + split * split_len;
    const int p_end = min(pq + 1, p_begin + split_len);
    float m[GM], l[GM], acc[GM][DPL];
    softmax_init(m, l, acc);
    const u64 row = (u64)n_kv_head * hd;
    const u32* table = bt + bt_off[seq];
    for (int base = p_begin; base < p_end; base += 32) {
        const int nr = min(32, p_end - base);
        const int p = base + lane;
        u64 e0 = 0;
        float s[GM];
#pragma unroll
        for (int g = 0; g < GM; g++) s[g] = 0.f;
        if (lane < nr) {
            e0 = ((u64)table[p / bs] * bs + p % bs) * row + (u64)kvh * hd;
            if (KT == KV_F16) {
                const uint4* kr = (const uint4*)(K + e0 * 2);
#pragma unroll 4
                for (int j = 0; j < hd / 8; j++) {
                    uint4 a = kr[j];
                    u32 aw[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
                    for (int c = 0; c < 8; c++) {
                        const float k = h2f((u16)((aw[c / 2] >> (16 * (c & 1))) & 0xffff));
#pragma unroll
                        for (int g = 0; g < GM; g++)
                            if (g < G) s[g] += Qs[g * hd + 8 * j + c] * k;
                    }
                }
            } else {
                const float4* kr = (const float4*)(K + e0 * 4);
#pragma unroll 4
                for (int j = 0; j < hd / 4; j++) {
                    float4 a = kr[j];
                    float ka[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
                    for (int c = 0; c < 4; c++)
#pragma unroll
                        for (int g = 0; g < GM; g++)
                            if (g < G) s[g] += Qs[g * hd + 4 * j + c] * ka[c];
                }
            }
        }
        const bool valid = lane < nr && p <= pq && p >= lo;
        float pj[GM];
        bool live[GM];
#pragma unroll
        for (int g = 0; g < GM; g++) {
            pj[g] = 0.f;
            live[g] = false;
            if (g >= G) continue;
            float sc = s[g] * scale;
            if (softcap > 0.f) sc = softcap * tanhf(sc / softcap);
            sc = valid ? sc : -INF;
            const float tmax = warp_max(sc);
            if (tmax == -INF) continue;
            live[g] = true;
            const float mn = fmaxf(m[g], tmax);
            pj[g] = valid ? expf(sc - mn) : 0.f;
            const float corr = expf(m[g] - mn);
            l[g] = l[g] * corr + warp_sum(pj[g]);
#pragma unroll
            for (int d = 0; d < DPL; d++) acc[g][d] *= corr;
            m[g] = mn;
        }
#pragma unroll 4
        for (int j = 0; j < nr; j++) {
            const u64 ej = __shfl_sync(0xffffffffu, e0, j);
            float v[DPL];
            kv_vec<KT, DPL>(V, ej + (u64)(DPL * lane), v);
#pragma unroll
            for (int g = 0; g < GM; g++) {
                if (g >= G) break;
                const float pb = __shfl_sync(0xffffffffu, pj[g], j);
                if (!live[g]) continue;
#pragma unroll
                for (int d = 0; d < DPL; d++) acc[g][d] += pb * v[d];
            }
        }
    }
#pragma unroll
    for (int g = 0; g < GM; g++) {
        if (g >= G) break;
        float* o = part + (((u64)t0 * n_head + kvh * G + g) * n_split + split) * (hd + 2);
        if (lane == 0) {
            o[0] = m[g];
            o[1] = l[g];
        }
#pragma unroll
        for (int d = 0; d < DPL; d++) o[2 + DPL * lane + d] = acc[g][d];
    }
}

// attng_<kv type>_<DPL>_<GM>: attn1_*'s parameters (rot and koff unused: f32 / f16 caches).
#define ATTNG(NAME, KT, DPL, GM)                                                                                   \
    extern "C" __global__ void __launch_bounds__(32) attng_##NAME##_##DPL##_##GM(                                   \
        const float* q, const u8* K, const u8* V, float* part, const u32* tiles, const u32* pos, const u32* bt_off, \
        const u32* bt, int n_head, int n_kv_head, int hd, int bs, float scale, float softcap, int window, int rot, int q16, const float* koff) { \
        attn_gqa<KT, DPL, GM>(q, K, V, part, tiles, pos, bt_off, bt, n_head, n_kv_head, hd, bs, scale, softcap, window, q16); \
    }
#define ATTNG_ALL(NAME, KT)                                                                                        \
    ATTNG(NAME, KT, 2, 2) ATTNG(NAME, KT, 2, 4) ATTNG(NAME, KT, 2, 8) ATTNG(NAME, KT, 4, 2) ATTNG(NAME, KT, 4, 4)  \
    ATTNG(NAME, KT, 4, 8) ATTNG(NAME, KT, 8, 2) ATTNG(NAME, KT, 8, 4) ATTNG(NAME, KT, 8, 8)
ATTNG_ALL(f32, KV_F32)
ATTNG_ALL(f16, KV_F16)
