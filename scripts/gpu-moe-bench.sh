#!/usr/bin/env bash
# MoE / hybrid models on a CUDA GPU (issue 7): the GPU tests of crates/backend-cuda/tests/moe.rs,
# then llama.cpp's llama-bench and `quarrel bench --device cuda` (fast and invariant numerics;
# NUMERICS="fast exact invariant" to choose) on the same full-size synthetic
# files (Nemotron-3-Nano-30B-A3B, Granite-4.0-H-Tiny, Mixtral-8x7B at Q4_K_M), one run.
#
#   QUARREL=path/to/quarrel MOE_TEST=path/to/moe-test-binary LLAMA_BIN=dir-with-llama-bench \
#     scripts/gpu-moe-bench.sh [MODELS_DIR]
#
# MOE_TEST: `cargo test --release -p quarrel-cuda --test moe --no-run` prints its path (skipped
# when unset). LLAMA_BIN defaults to the carried build unpacked from .carry/llamacuda. Needs
# ~52 GB of disk for the three files (written with `quarrel synth --fast`).
set -uo pipefail
cd "$(dirname "$0")/.."
Q=${QUARREL:-target/release/quarrel}
M=${1:-/tmp/moe-models}
export QUARREL_HOME=${QUARREL_HOME:-/tmp/qh}
if [ -z "${LLAMA_BIN:-}" ] && ls .carry/llamacuda/llamacuda.part* >/dev/null 2>&1; then
  mkdir -p /tmp/l && cat .carry/llamacuda/llamacuda.part* | xz -d | tar -x -C /tmp/l && LLAMA_BIN=/tmp/l/llamacuda
fi
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LLAMA_BIN:-}:${LD_LIBRARY_PATH:-}
mkdir -p "$M"
MODELS="nemotron-3-nano-30b-a3b granite-4.0-h-tiny mixtral-8x7b"
( for m in $MODELS; do [ -f "$M/$m.gguf" ] || "$Q" synth -p $m -q q4_k_m --fast --quiet -t 8 "$M/$m.gguf"; done ) &
SYN=$!
if [ -n "${MOE_TEST:-}" ]; then
  echo "== MoE GPU tests"
  (cd crates/backend-cuda && QUARREL_FIXTURES=$PWD/../../tests/fixtures timeout 600 "$MOE_TEST" --test-threads 1 --nocapture 2>&1) \
    | grep -E "^test |nmse|router|panicked|test result" | grep -v "n_batch"
fi
wait $SYN
for m in $MODELS; do
  echo "== $m"
  [ -n "${LLAMA_BIN:-}" ] && timeout 120 "$LLAMA_BIN/llama-bench" -m "$M/$m.gguf" -ngl 99 -fa 1 -p 512 -n 128 -r 2 2>&1 | grep -E "^\| [a-z]" | tail -2
  for n in ${NUMERICS:-fast invariant}; do
    echo "-- quarrel --numerics $n"
    timeout 120 "$Q" bench --device cuda -m "$M/$m.gguf" --numerics $n -p 512 -n 128 -r 2 2>&1 | grep -E "^\| [a-z]|rror" | tail -2
  done
done
