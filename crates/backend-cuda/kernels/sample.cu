// Sampling on the device (src/sample.rs): one block per logits row runs the request's chain and
// writes only the picked token id. The arithmetic is that of the reference twin
// (quarrel_core::sample_masked_ref): biases (in order), the allowed-token mask (others at -inf),
// penalties, top-k (k <= SAMPLE_MAX_K; ties at the k-th place keep the lower ids), softmax with
// a left-to-right f32 sum, top-p, min-p, / temperature, softmax, the first token whose
// cumulative probability passes the host's uniform draw r (none: the last with a probability
// above 0). expf here is CUDA's (within 2 ulp), the host's is libm's: a pick can differ only
// where r or top_p lies within a few ulp of a cumulative probability.

#define SAMPLE_MAX_K 256
// words per row in the parameter array: temperature, top_k, top_p, min_p, repeat, presence,
// frequency, r, then offsets into the data array and counts: penalty pairs (token, count),
// bias pairs (token, f32 bits), mask words (offset NO_MASK: unmasked)
#define SAMPLE_PARAMS 14
#define NO_MASK 0xffffffffu

// Whether the row's mask (words at m, nw of them; bit t % 32 of word t / 32) allows token t.
__device__ __forceinline__ bool mask_allows(const u32* __restrict__ data, u32 m, u32 nw, u32 t) {
    return m == NO_MASK || ((t >> 5) < nw && ((data[m + (t >> 5)] >> (t & 31u)) & 1u));
}

// Order-preserving key of a float: larger float (Rust's total_cmp order) -> larger key.
__device__ __forceinline__ u32 skey(float f) {
    u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float sval(u32 k) { return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }

// e[j] = expf(v[j] - max(v)) for j < n (f32::max fold: NaN ignored); the block's threads share
// the exponentials, thread 0 returns the left-to-right sum in sum[0].
__device__ __forceinline__ void softmax_terms(const float* v, float* e, int n, float* sum) {
    if (threadIdx.x == 0) {
        float m = -INF;
        for (int j = 0; j < n; j++) m = fmaxf(m, v[j]);
        sum[1] = m;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += blockDim.x) e[j] = expf(__fsub_rn(v[j], sum[1]));
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.f;
        for (int j = 0; j < n; j++) s = __fadd_rn(s, e[j]);
        sum[0] = s;
    }
    __syncthreads();
}

// x: rows of dim logits; work: the same size (the adjusted copy); prm: SAMPLE_PARAMS words per
// row; data: what prm's offsets point at; out: one id per row. blockDim a multiple of 32, <= 1024.
extern "C" __global__ void __launch_bounds__(1024) sample_rows(const float* __restrict__ x, float* __restrict__ work, const u32* __restrict__ prm,
                                                               const u32* __restrict__ data, u32* __restrict__ out, int dim) {
    GDC();
    __shared__ u32 hist[256];
    __shared__ u32 ck[SAMPLE_MAX_K], ci[SAMPLE_MAX_K], si[SAMPLE_MAX_K];
    __shared__ float sv[SAMPLE_MAX_K], se[SAMPLE_MAX_K];
    __shared__ u32 su[4];
    __shared__ float sf[2];
    __shared__ u32 wcnt[32];
    const int tid = threadIdx.x, nt = blockDim.x;
    const u32* p = prm + (u64)blockIdx.x * SAMPLE_PARAMS;
    const float temp = __uint_as_float(p[0]), top_p = __uint_as_float(p[2]), min_p = __uint_as_float(p[3]);
    const float rep = __uint_as_float(p[4]), pres = __uint_as_float(p[5]), freq = __uint_as_float(p[6]), r = __uint_as_float(p[7]);
    const float* xr = x + (u64)blockIdx.x * dim;
    float* w = work + (u64)blockIdx.x * dim;

    // 1. the row masked, with the biases of allowed tokens (in order: a token may repeat; a
    // masked one stays at -inf), then the penalties (each token once in the list)
    const u32 m = p[12], nw = p[13];
    for (int i = tid; i < dim; i += nt) w[i] = mask_allows(data, m, nw, (u32)i) ? xr[i] : -INF;
    __syncthreads();
    if (tid == 0) {
        for (u32 j = 0; j < p[11]; j++) {
            const u32 t = data[p[10] + 2 * j];
            if (t < (u32)dim && mask_allows(data, m, nw, t)) w[t] = __fadd_rn(w[t], __uint_as_float(data[p[10] + 2 * j + 1]));
        }
    }
    __syncthreads();
    for (u32 j = tid; j < p[9]; j += nt) {
        const u32 t = data[p[8] + 2 * j], n = data[p[8] + 2 * j + 1];
        if (t < (u32)dim) {
            float v = w[t];
            v = v > 0.f ? __fdiv_rn(v, rep) : __fmul_rn(v, rep);
            w[t] = __fsub_rn(v, __fadd_rn(__fmul_rn((float)n, freq), pres));
        }
    }
    __syncthreads();
    if (temp <= 0.f) {
        const u32 a = row_argmax(w, dim);
        if (tid == 0) out[blockIdx.x] = a;
        return;
    }
    const int k = min((int)p[1], dim);

    // 2. the k-th largest key, 8 bits at a time from the top; `need`: how many equal to it
    u32 prefix = 0, mask = 0, need = (u32)k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += nt) hist[b] = 0;
        __syncthreads();
        for (int i = tid; i < dim; i += nt) {
            const u32 key = skey(w[i]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid == 0) {
            u32 cum = 0;
            int b = 255;
            for (; b > 0; b--) {
                if (cum + hist[b] >= need) break;
                cum += hist[b];
            }
            su[0] = (u32)b;
            su[1] = need - cum;
        }
        __syncthreads();
        prefix |= su[0] << shift;
        mask |= 255u << shift;
        need = su[1];
        __syncthreads();
    }

    // 3. the candidates: every key above, then the lowest ids equal to it
    if (tid == 0) su[2] = 0;
    __syncthreads();
    for (int i = tid; i < dim; i += nt) {
        const u32 key = skey(w[i]);
        if (key > prefix) {
            const u32 s = atomicAdd(&su[2], 1u);
            ck[s] = key;
            ci[s] = (u32)i;
        }
    }
    __syncthreads();
    const u32 ngt = su[2];
    const int lane = tid % 32, wid = tid / 32;
    u32 taken = 0;
    for (int c = 0; c < dim && taken < need; c += nt) {
        const int i = c + tid;
        const bool eq = i < dim && skey(w[i]) == prefix;
        const u32 bal = __ballot_sync(0xffffffffu, eq);
        if (lane == 0) wcnt[wid] = __popc(bal);
        __syncthreads();
        u32 before = 0, total = 0;
        for (int j = 0; j < nt / 32; j++) {
            before += j < wid ? wcnt[j] : 0u;
            total += wcnt[j];
        }
        const u32 pos = taken + before + __popc(bal & ((1u << lane) - 1u));
        if (eq && pos < need) {
            ck[ngt + pos] = prefix;
            ci[ngt + pos] = (u32)i;
        }
        taken += total;
        __syncthreads();
    }

    // 4. sorted by key descending, id ascending (ranks are distinct)
    for (int a = tid; a < k; a += nt) {
        const u32 ka = ck[a], ia = ci[a];
        int rank = 0;
        for (int b = 0; b < k; b++) rank += (ck[b] > ka) || (ck[b] == ka && ci[b] < ia);
        sv[rank] = sval(ka);
        si[rank] = ia;
    }
    __syncthreads();

    // 5. softmax, top-p, min-p on the untempered probabilities
    softmax_terms(sv, se, k, sf);
    if (tid == 0) {
        const float s = sf[0];
        int keep = k;
        if (top_p < 1.f) {
            float cum = 0.f;
            for (int j = 0; j < k; j++) {
                cum = __fadd_rn(cum, __fdiv_rn(se[j], s));
                if (cum >= top_p) {
                    keep = j + 1;
                    break;
                }
            }
        }
        if (min_p > 0.f) {
            const float thr = __fmul_rn(min_p, __fdiv_rn(se[0], s));
            int c = 0;
            while (c < k && __fdiv_rn(se[c], s) >= thr) c++;
            keep = min(keep, max(c, 1));
        }
        su[3] = (u32)max(keep, 1);
    }
    __syncthreads();
    const int keep = (int)su[3];

    // 6. the kept logits / temperature, softmax, the draw
    for (int j = tid; j < keep; j += nt) sv[j] = __fdiv_rn(sv[j], temp);
    __syncthreads();
    softmax_terms(sv, se, keep, sf);
    if (tid == 0) {
        const float s = sf[0];
        float cum = 0.f;
        u32 pick = si[0];
        for (int j = 0; j < keep; j++) {
            const float pr = __fdiv_rn(se[j], s);
            cum = __fadd_rn(cum, pr);
            if (r < cum) {
                pick = si[j];
                break;
            }
            if (pr > 0.f) pick = si[j];
        }
        out[blockIdx.x] = pick;
    }
}
