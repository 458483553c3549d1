#!/usr/bin/env bash
# Regenerate tests/fixtures/moe/*.json (issue 7) on a machine with cmake and a C/C++
# compiler (no network needed): builds llama.cpp 0.3.36 CPU-only as a shared library,
# writes the tiny synthetic models with the given quarrel binary (Q8_0, seed 7; Q4_K would be
# repacked by llama.cpp into its 8x8 GEMM, whose rounding differs from vec_dot_q4_K_q8_K), and
# runs scripts/moe_fixtures.c against libllama for each.
#
# Usage: moe-fixtures.sh QUARREL_BIN LLAMA_TRIM_TGZ OUT_DIR
# (the device run carried .carry/moe/{quarrel,scripts} and .carry/llama/llama-trim.tgz;
# the JSON files were copied to tests/fixtures/moe/).
set -euo pipefail
QUARREL=$1 TGZ=$2 OUT=$3
W=$(mktemp -d)
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
tar xzf "$TGZ" -C "$W"
# Quarrel's CPU kernels round as ggml's AVX-512 build does (docs/REFERENCE): build that
# where the CPU has it (AMX off: it crashes in these VMs), else AVX2.
SIMD="-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
DESC="AVX2"
if grep -qw avx512f /proc/cpuinfo && grep -qw avx512dq /proc/cpuinfo; then
  SIMD="$SIMD -DGGML_AVX512=ON"; DESC="AVX-512"
  grep -qw avx512vbmi /proc/cpuinfo && { SIMD="$SIMD -DGGML_AVX512_VBMI=ON"; DESC="$DESC VBMI"; }
  grep -qw avx512_vnni /proc/cpuinfo && { SIMD="$SIMD -DGGML_AVX512_VNNI=ON"; DESC="$DESC VNNI"; }
  grep -qw avx512_bf16 /proc/cpuinfo && { SIMD="$SIMD -DGGML_AVX512_BF16=ON"; DESC="$DESC BF16"; }
fi
echo "llama.cpp CPU build: $DESC"
cmake -S "$W/llama.cpp" -B "$W/b" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_CUDA=OFF \
  -DGGML_NATIVE=OFF $SIMD \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=OFF >"$W/cmake.log" 2>&1 || { tail -30 "$W/cmake.log"; exit 1; }
cmake --build "$W/b" -j"$(nproc)" --target llama >"$W/build.log" 2>&1 || { tail -40 "$W/build.log"; exit 1; }
LIB=$(dirname "$(find "$W/b" -name 'libllama.so' | head -1)")
cc -O2 -o "$W/moe_fixtures" "$here/moe_fixtures.c" -I"$W/llama.cpp/include" -I"$W/llama.cpp/ggml/include" \
  -L"$LIB" -lllama -Wl,-rpath,"$LIB"
mkdir -p "$W/models"
status=0
# every tiny preset the binary has (one per architecture beyond plain llama)
for p in $("$QUARREL" synth --list | awk '$1 ~ /^tiny-/ && $2 != "bert" {print $1}'); do
  "$QUARREL" synth -p "$p" -q q8_0 --seed 7 --quiet "$W/models/$p.gguf"
  "$W/moe_fixtures" "$W/models/$p.gguf" "$p" "$OUT/$p.json" "$DESC" || { echo "$p: FAILED"; status=1; }
done
sha256sum "$W"/models/*.gguf
exit $status
