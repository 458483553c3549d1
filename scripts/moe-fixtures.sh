#!/usr/bin/env bash
# Regenerate tests/fixtures/moe/*.json (issue 7) on a machine with cmake, a C++ compiler,
# python3 + numpy and no network: builds llama.cpp CPU-only as a shared library, writes the
# tiny synthetic models with the given quarrel binary, runs scripts/moe_fixtures.py.
#
# Usage: moe-fixtures.sh QUARREL_BIN LLAMA_TRIM_TGZ LLAMA_CPP_PY_DIR DISKCACHE_WHL OUT_DIR
# (the device run carried .carry/moe/{quarrel,llama_cpp,diskcache-*.whl,scripts} and
# .carry/llama/llama-trim.tgz; outputs were copied to tests/fixtures/moe/).
set -euo pipefail
QUARREL=$1 TGZ=$2 PYPKG=$3 WHL=$4 OUT=$5
W=$(mktemp -d)
here=$(cd "$(dirname "$0")" && pwd)
tar xzf "$TGZ" -C "$W"
cmake -S "$W/llama.cpp" -B "$W/b" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_CUDA=OFF \
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=OFF >"$W/cmake.log" 2>&1 || { tail -30 "$W/cmake.log"; exit 1; }
cmake --build "$W/b" -j"$(nproc)" --target llama >"$W/build.log" 2>&1 || { tail -40 "$W/build.log"; exit 1; }
LIB=$(dirname "$(find "$W/b" -name 'libllama.so*' | head -1)")
echo "libllama in $LIB: $(ls "$LIB" | tr '\n' ' ')"
mkdir -p "$W/models" "$W/site" "$W/py"
for p in tiny-mixtral tiny-granite tiny-granitemoe tiny-granitehybrid tiny-mamba2 tiny-nemotron-h tiny-nemotron-h-moe; do
  "$QUARREL" synth -p "$p" -q q4_k_m --seed 7 --quiet "$W/models/$p.gguf"
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$W/site" "$WHL"
cp -r "$PYPKG" "$W/py/llama_cpp"
LD_LIBRARY_PATH="$LIB:${LD_LIBRARY_PATH:-}" LLAMA_CPP_LIB_PATH="$LIB" PYTHONPATH="$W/py:$W/site" PYTHONUNBUFFERED=1 \
  python3 "$here/moe_fixtures.py" "$W/models" "$OUT"
sha256sum "$W"/models/*.gguf
