// llama.cpp's outputs of an encoder, for the encoder tests (crates/engine/tests/encoders.rs,
// crates/cli/tests/nomic_embed.rs). Every sequence is decoded alone (one llama_decode).
//   hidden PRESET: per-token hidden states (no pooling) of the 16 fixture tokens of a
//                  `quarrel synth -p PRESET -q f32 --seed 7` model;
//   rank PRESET:   a reranker's scores (rank pooling) of 4 fixture sequences;
//   texts FILE:    each line of FILE tokenized by llama.cpp (special tokens added, as
//                  llama-embedding does), mean-pooled (the model's pooling) and L2-normalized.
// Usage: embed_fixtures MODEL.gguf OUT.json SIMD MODE ARG
#include "llama.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_TOK 16
#define MAX_TOK 4096

static void quiet(enum ggml_log_level level, const char * text, void * data) {
    (void) level; (void) text; (void) data;
}

static struct llama_context * context(struct llama_model * model, enum llama_pooling_type pooling) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 2048;
    cp.n_batch = 2048;
    cp.n_ubatch = 2048;
    cp.n_seq_max = 1;
    cp.embeddings = true;
    cp.pooling_type = pooling;
    return llama_init_from_model(model, cp);
}

// decode one sequence alone (memory cleared first)
static int decode(struct llama_context * ctx, const llama_token * toks, int n) {
    llama_memory_clear(llama_get_memory(ctx), true);
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = toks[i];
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    b.n_tokens = n;
    int r = llama_decode(ctx, b);
    llama_batch_free(b);
    return r;
}

static void write_tokens(FILE * f, const llama_token * t, int n) {
    fprintf(f, "[");
    for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? "," : "", t[i]);
    fprintf(f, "]");
}

static void write_vec(FILE * f, const float * v, int n, float scale) {
    fprintf(f, "[");
    for (int d = 0; d < n; d++) fprintf(f, "%s%.7g", d ? "," : "", v[d] * scale);
    fprintf(f, "]");
}

// crates/engine/tests/moe_hybrid.rs::fixture_tokens
static int fixture_tokens(llama_token * t, int n, int salt) {
    for (int i = 0; i < n; i++) t[i] = i == 0 ? 1 : (i * 97 + 13 + salt * 31) % 509 + 3;
    return n;
}

int main(int argc, char ** argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s MODEL.gguf OUT.json SIMD hidden|rank|texts PRESET|FILE\n", argv[0]);
        return 2;
    }
    const char * mode = argv[4];
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) { fprintf(stderr, "%s: load failed\n", argv[1]); return 1; }
    const int n_embd = llama_model_n_embd(model);
    FILE * f = fopen(argv[2], "w");
    if (!f) { perror(argv[2]); return 1; }
    static llama_token toks[MAX_TOK];
    if (!strcmp(mode, "hidden")) {
        struct llama_context * ctx = context(model, LLAMA_POOLING_TYPE_NONE);
        int n = fixture_tokens(toks, N_TOK, 0);
        if (!ctx || decode(ctx, toks, n)) { fprintf(stderr, "decode failed\n"); return 1; }
        fprintf(f, "{\"preset\":\"%s\",\"model\":\"%s.gguf (quarrel synth -p %s -q f32 --seed 7)\",", argv[5], argv[5], argv[5]);
        fprintf(f, "\"reference\":\"llama.cpp 0.3.36 libllama, CPU (%s), one llama_decode, embeddings at every position, no pooling\",\"tokens\":", argv[3]);
        write_tokens(f, toks, n);
        fprintf(f, ",\"n_embd\":%d,\"hidden\":[", n_embd);
        for (int i = 0; i < n; i++) {
            const float * e = llama_get_embeddings_ith(ctx, i);
            if (!e) { fprintf(stderr, "no embedding at %d\n", i); return 1; }
            if (i) fprintf(f, ",");
            write_vec(f, e, n_embd, 1.0f);
        }
        fprintf(f, "]}\n");
    } else if (!strcmp(mode, "rank")) {
        struct llama_context * ctx = context(model, LLAMA_POOLING_TYPE_RANK);
        const int n_out = (int) llama_model_n_cls_out(model);
        const int lens[4] = {16, 5, 33, 2};
        fprintf(f, "{\"preset\":\"%s\",\"model\":\"%s.gguf (quarrel synth -p %s -q f32 --seed 7)\",", argv[5], argv[5], argv[5]);
        fprintf(f, "\"reference\":\"llama.cpp 0.3.36 libllama, CPU (%s), one llama_decode per sequence, rank pooling\",\"seqs\":[", argv[3]);
        for (int s = 0; s < 4; s++) {
            fixture_tokens(toks, lens[s], s);
            if (s) fprintf(f, ",");
            write_tokens(f, toks, lens[s]);
        }
        fprintf(f, "],\"scores\":[");
        for (int s = 0; s < 4; s++) {
            int n = fixture_tokens(toks, lens[s], s);
            if (!ctx || decode(ctx, toks, n)) { fprintf(stderr, "decode failed\n"); return 1; }
            const float * e = llama_get_embeddings_seq(ctx, 0);
            if (!e) { fprintf(stderr, "no score\n"); return 1; }
            if (s) fprintf(f, ",");
            write_vec(f, e, n_out, 1.0f);
        }
        fprintf(f, "]}\n");
    } else if (!strcmp(mode, "texts")) {
        struct llama_context * ctx = context(model, LLAMA_POOLING_TYPE_UNSPECIFIED);
        FILE * in = fopen(argv[5], "r");
        if (!in || !ctx) { perror(argv[5]); return 1; }
        const struct llama_vocab * vocab = llama_model_get_vocab(model);
        static char line[1 << 16];
        fprintf(f, "{\"reference\":\"llama.cpp 0.3.36 libllama, CPU (%s), each text tokenized with special tokens, one llama_decode, the model's pooling, L2-normalized\",\"items\":[", argv[3]);
        int k = 0;
        while (fgets(line, sizeof line, in)) {
            size_t len = strlen(line);
            if (len && line[len - 1] == '\n') line[--len] = 0;
            int n = llama_tokenize(vocab, line, (int) len, toks, MAX_TOK, true, true);
            if (n < 0 || decode(ctx, toks, n)) { fprintf(stderr, "text %d failed\n", k); return 1; }
            const float * e = llama_get_embeddings_seq(ctx, 0);
            double ss = 0;
            for (int d = 0; d < n_embd; d++) ss += (double) e[d] * e[d];
            fprintf(f, "%s{\"tokens\":", k++ ? "," : "");
            write_tokens(f, toks, n);
            fprintf(f, ",\"embedding\":");
            write_vec(f, e, n_embd, (float) (1.0 / sqrt(ss)));
            fprintf(f, "}");
        }
        fprintf(f, "]}\n");
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    fclose(f);
    llama_model_free(model);
    return 0;
}
