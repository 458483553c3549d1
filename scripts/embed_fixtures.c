// llama.cpp's per-token hidden states of an encoder (quarrel synth -p tiny-bert), for
// crates/engine/tests/encoders.rs: one sequence of the fixture tokens, embeddings on, no pooling.
// Usage: embed_fixtures MODEL.gguf PRESET OUT.json SIMD
#include "llama.h"
#include <stdio.h>
#include <stdlib.h>

#define N_TOK 16

static void quiet(enum ggml_log_level level, const char * text, void * data) {
    (void) level; (void) text; (void) data;
}

int main(int argc, char ** argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s MODEL.gguf PRESET OUT.json SIMD\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) { fprintf(stderr, "%s: load failed\n", argv[1]); return 1; }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 64;
    cp.n_batch = 64;
    cp.n_ubatch = 64;
    cp.n_seq_max = 1;
    cp.embeddings = true;
    cp.pooling_type = LLAMA_POOLING_TYPE_NONE;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "%s: context failed\n", argv[1]); return 1; }
    // crates/engine/tests/moe_hybrid.rs::fixture_tokens
    llama_token toks[N_TOK];
    for (int i = 0; i < N_TOK; i++) toks[i] = i == 0 ? 1 : (i * 97 + 13) % 509 + 3;
    struct llama_batch b = llama_batch_init(N_TOK, 0, 1);
    for (int i = 0; i < N_TOK; i++) {
        b.token[i] = toks[i];
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    b.n_tokens = N_TOK;
    if (llama_decode(ctx, b) != 0) { fprintf(stderr, "%s: decode failed\n", argv[1]); return 1; }
    const int n_embd = llama_model_n_embd(model);
    FILE * f = fopen(argv[3], "w");
    if (!f) { perror(argv[3]); return 1; }
    fprintf(f, "{\"preset\":\"%s\",\"model\":\"%s.gguf (quarrel synth -p %s -q f32 --seed 7)\",", argv[2], argv[2], argv[2]);
    fprintf(f, "\"reference\":\"llama.cpp 0.3.36 libllama, CPU (%s), one llama_decode, embeddings at every position, no pooling\",", argv[4]);
    fprintf(f, "\"tokens\":[");
    for (int i = 0; i < N_TOK; i++) fprintf(f, "%s%d", i ? "," : "", toks[i]);
    fprintf(f, "],\"n_embd\":%d,\"hidden\":[", n_embd);
    for (int i = 0; i < N_TOK; i++) {
        const float * e = llama_get_embeddings_ith(ctx, i);
        if (!e) { fprintf(stderr, "no embedding at %d\n", i); return 1; }
        fprintf(f, "%s[", i ? "," : "");
        for (int d = 0; d < n_embd; d++) fprintf(f, "%s%.7g", d ? "," : "", e[d]);
        fprintf(f, "]");
    }
    fprintf(f, "]}\n");
    fclose(f);
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
