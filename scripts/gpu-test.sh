#!/usr/bin/env bash
# GPU test suite of the CUDA backend (crates/backend-cuda/tests): every op vs the CPU backend,
# MMQ vs its twin / the CPU / the GEMV, MoE and Mamba2 models vs llama.cpp's fixtures, the
# prefill scan kernels vs token steps, synthetic models of every weight mix, and SmolLM2 greedy
# texts / perplexity vs the CPU when QUARREL_SMOLLM2 names the model. The GPU tests are
# `#[ignore]`d (a plain `cargo test` without a GPU reports them as ignored); this runs them
# with --include-ignored and fails where no CUDA device is found.
#
#   scripts/gpu-test.sh                 build with cargo and run
#   BIN_DIR=dir scripts/gpu-test.sh     run prebuilt test binaries dir/{ops,decode,model,mmq,moe,attn_batch,numerics,ssm,gdc}
#                                       (a GPU machine without a Rust toolchain)
set -euo pipefail
cd "$(dirname "$0")/.."
export QUARREL_FIXTURES="${QUARREL_FIXTURES:-$PWD/tests/fixtures}"
if [ -n "${BIN_DIR:-}" ]; then
    status=0
    for t in ops decode model mmq moe attn_batch numerics ssm gdc; do
        [ -x "$BIN_DIR/$t" ] || { echo "== $t: no $BIN_DIR/$t, skipped"; status=1; continue; }
        echo "== $t"
        "$BIN_DIR/$t" --include-ignored --nocapture --test-threads=1 || status=1
    done
    exit $status
fi
cargo test --release -p quarrel-cuda -- --include-ignored --nocapture --test-threads=1
