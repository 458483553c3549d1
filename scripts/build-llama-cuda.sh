#!/usr/bin/env bash
# Build llama.cpp on a GPU machine (CUDA sm_90 SASS only, shared libraries with RPATH $ORIGIN) and
# write it xz-packed in 15 MiB parts to $OUT: ~23 MB, small enough to be carried to later calls as
# .carry/llamacuda (scripts/gpu-bench.sh unpacks it). Run from the repository root with the trimmed
# source at .carry/llama/llama-trim.tgz (README "Reference builds"). ~4 min on 16 cores.
set -uo pipefail
T0=$(date +%s)
export PATH=/usr/local/cuda/bin:$PATH
W=/tmp/lw; mkdir -p $W && tar -xzf .carry/llama/llama-trim.tgz -C $W
src=$(dirname "$(find $W -mindepth 2 -maxdepth 2 -name CMakeLists.txt | head -1)")
echo "src $src"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv
cmake -S "$src" -B $W/b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DBUILD_SHARED_LIBS=ON \
  -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_RPATH='$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON > $OUT/cmake.log 2>&1 || { tail -30 $OUT/cmake.log; exit 1; }
timeout 560 cmake --build $W/b -j16 --target llama-bench llama-batched-bench > $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; }
echo "built in $(( $(date +%s) - T0 )) s"
mkdir -p /tmp/pk/llamacuda && cd $W/b/bin && ls -la
cp -a llama-bench llama-batched-bench *.so* /tmp/pk/llamacuda/ 2>/dev/null
cd /tmp/pk && strip --strip-unneeded llamacuda/* 2>/dev/null; ls -la llamacuda
LD_LIBRARY_PATH=/usr/local/cuda/lib64 ldd llamacuda/llama-bench | head -20
tar -cf - llamacuda | xz -T16 -6 > /tmp/pk/l.tar.xz; ls -la /tmp/pk/l.tar.xz
split -b 15M -d /tmp/pk/l.tar.xz $OUT/llamacuda.part
ls -la $OUT; echo "total $(( $(date +%s) - T0 )) s"
