// llama.cpp's logits on the tiny MoE / hybrid Mamba2 synthetic models (issue 7 fixtures).
//
// Usage: moe_fixtures MODEL.gguf PRESET OUT.json SIMD [N_GPU_LAYERS]
// N_GPU_LAYERS > 0 (a CUDA build of libllama: scripts/moe-fixtures-cuda.sh): the model's layers
// on the GPU, llama.cpp's own CUDA numerics (flash attention as its defaults choose).
// Evaluates the fixed token sequence in one llama_decode with logits for every position
// (what llama-cpp-python's logits_all=True does) and writes the tokens and logits as JSON
// (6 significant digits). Built and run by scripts/moe-fixtures.sh against libllama
// (llama.cpp 0.3.36, CPU only). The C API is used directly: llama-cpp-python 0.3.36
// segfaulted inside llama_model_load (print_info) on the GPU machine's Python.
#include "llama.h"
#include <stdio.h>
#include <stdlib.h>

#define N_TOK 16

static void quiet(enum ggml_log_level level, const char * text, void * ud) {
    (void) ud;
    if (level >= GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

int main(int argc, char ** argv) {
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: %s MODEL.gguf PRESET OUT.json SIMD [N_GPU_LAYERS]\n", argv[0]);
        return 2;
    }
    const int ngl = argc == 6 ? atoi(argv[5]) : 0;
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = ngl;
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "%s: load failed\n", argv[1]); return 1; }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 64;
    cp.n_batch = 64;
    cp.n_ubatch = 64;
    cp.n_seq_max = 1;
    cp.n_threads = 8;
    cp.n_threads_batch = 8;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "%s: context failed\n", argv[1]); return 1; }
    // BOS then 15 ids: crates/engine/tests/moe_hybrid.rs::fixture_tokens
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
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE * f = fopen(argv[3], "w");
    if (!f) { perror(argv[3]); return 1; }
    fprintf(f, "{\"preset\":\"%s\",\"model\":\"%s.gguf (quarrel synth -p %s -q q8_0 --seed 7)\",", argv[2], argv[2], argv[2]);
    if (ngl > 0) {
        fprintf(f, "\"reference\":\"llama.cpp 0.3.36 libllama, CUDA (%s, n_gpu_layers %d, default context parameters), one llama_decode with logits at every position\",", argv[4], ngl);
    } else {
        fprintf(f, "\"reference\":\"llama.cpp 0.3.36 libllama, CPU (%s), one llama_decode with logits at every position\",", argv[4]);
    }
    fprintf(f, "\"tokens\":[");
    for (int i = 0; i < N_TOK; i++) fprintf(f, "%s%d", i ? "," : "", toks[i]);
    fprintf(f, "],\"n_vocab\":%d,\"logits\":[", n_vocab);
    for (int i = 0; i < N_TOK; i++) {
        const float * l = llama_get_logits_ith(ctx, i);
        fprintf(f, "%s[", i ? "," : "");
        int best = 0;
        for (int v = 0; v < n_vocab; v++) {
            fprintf(f, "%s%.6g", v ? "," : "", l[v]);
            if (l[v] > l[best]) best = v;
        }
        fprintf(f, "]");
        printf("%s pos %d argmax %d logit %.4f\n", argv[2], i, best, l[best]);
    }
    fprintf(f, "]}\n");
    fclose(f);
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
