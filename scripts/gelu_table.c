// Build: gcc -O2 -I<llama.cpp>/ggml/include scripts/gelu_table.c -L<build>/bin -lggml-cpu -lggml-base -lggml
// Run:   ./a.out > tests/fixtures/act/gelu_f16_table.bin  (read by quarrel-core's act tests)
// Dump llama.cpp's CPU GELU of every finite f16 input in (-10, 10) as f16 bits (ggml_gelu on f32
// inputs goes through ggml_table_gelu_f16), for comparing Quarrel's table bit for bit.
#include "ggml.h"
#include "ggml-cpu.h"
#include <stdio.h>
#include <stdint.h>
int main(void) {
    struct ggml_init_params ip = { 64u << 20, NULL, false };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 65536);
    float * xv = (float *) x->data;
    for (int i = 0; i < 65536; i++) xv[i] = ggml_fp16_to_fp32((ggml_fp16_t) i);
    struct ggml_tensor * y = ggml_gelu(ctx, x);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    ggml_graph_compute_with_ctx(ctx, gf, 1);
    float * yv = (float *) y->data;
    uint64_t h = 1469598103934665603ull;
    int n = 0;
    for (int i = 0; i < 65536; i++) {
        float v = xv[i];
        if (!(v > -10.0f && v < 10.0f)) continue;  // NaN, inf and |x| >= 10 bypass the table
        uint16_t b = ggml_fp32_to_fp16(yv[i]);
        fwrite(&b, 2, 1, stdout);
        n++;
    }
    fprintf(stderr, "%d table entries\n", n);
    return 0;
}
