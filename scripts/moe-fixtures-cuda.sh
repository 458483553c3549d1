#!/usr/bin/env bash
# llama.cpp's own CUDA logits on the tiny MoE / hybrid presets (issue 7): the reference for
# Quarrel's invariant numerics on CUDA, whose tensor-core attention rounds as llama.cpp's CUDA
# flash attention does (f16 probabilities, f32 accumulators) rather than as its CPU flash
# attention (f16 accumulator of P·V), which tests/fixtures/moe/*.json record.
# Writes tests/fixtures/moe-cuda/*.json; run on the GPU machine (CI never builds llama.cpp).
#
# Usage: moe-fixtures-cuda.sh QUARREL_BIN LLAMA_CUDA_LIB_DIR LLAMA_TRIM_TGZ OUT_DIR
# LLAMA_CUDA_LIB_DIR: libllama.so and the ggml libraries of a CUDA build of the same llama.cpp
# (scripts/build-llama-cuda.sh); LLAMA_TRIM_TGZ: its source (for the headers).
set -euo pipefail
QUARREL=$1 LIB=$2 TGZ=$3 OUT=$4
W=$(mktemp -d)
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
tar xzf "$TGZ" -C "$W" --wildcards 'llama.cpp/include/*' 'llama.cpp/ggml/include/*'
cc -O2 -o "$W/moe_fixtures" "$here/moe_fixtures.c" -I"$W/llama.cpp/include" -I"$W/llama.cpp/ggml/include" \
  -L"$LIB" -lllama -Wl,-rpath,"$LIB"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
mkdir -p "$W/models"
status=0
# every tiny preset the binary has (one per architecture beyond plain llama)
for p in $("$QUARREL" synth --list | awk '$1 ~ /^tiny-/ && $2 != "bert" {print $1}'); do
  "$QUARREL" synth -p "$p" -q q8_0 --seed 7 --quiet "$W/models/$p.gguf"
  "$W/moe_fixtures" "$W/models/$p.gguf" "$p" "$OUT/$p.json" "$GPU" 99 || { echo "$p: FAILED"; status=1; }
done
sha256sum "$W"/models/*.gguf
exit $status
