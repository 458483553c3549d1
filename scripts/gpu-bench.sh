#!/usr/bin/env bash
# Quarrel's CUDA backend against llama.cpp on one GPU machine, in one run (the one command for
# GPU speed and correctness figures):
#   1. finds llama.cpp's CUDA llama-bench: LLAMA_BIN, else the carried prebuilt parts
#      (.carry/llamacuda/llamacuda.part*, an xz tar), else (LLAMA_BUILD=1, the default) builds it
#      from the source tarball in the background; none: Quarrel's columns only;
#   2. writes synthetic models with real shapes (`quarrel synth`): Mistral-7B Q4_0 and Q4_K_M,
#      TinyLlama-1.1B Q4_0 (in the background while the tests run);
#   3. runs the GPU test suite (scripts/gpu-test.sh) and measures device-to-device copy bandwidth;
#   4. runs `quarrel bench --device cuda` and `llama-bench -ngl 99 -fa 1` on the same files;
#   5. prints one table: pp512 / tg128 of both and the ratios, and per 7B model the decode
#      bandwidth (weight bytes per token x t/s) against the copy figure of this run.
#
# Environment: QUARREL (the quarrel binary; default target/release/quarrel), LLAMA_BIN (folder
# holding a prebuilt llama-bench), LLAMA_PARTS (default .carry/llamacuda), LLAMA_TGZ (llama.cpp
# source .tgz for the fallback build; default .carry/llama/llama-trim.tgz), LLAMA_BUILD (0: never
# build), BIN_DIR (prebuilt test binaries, see gpu-test.sh), SKIP_TESTS (1: benchmarks only),
# WORK (scratch folder; default /tmp/qbench), OUT (logs and JSON; default $WORK/out), REPS
# (repetitions, default 3), MODELS (subset), DEVICE (quarrel's --device, default cuda; cpu for a
# dry run), TIMEOUT (seconds per benchmark command, default 300), TEST_TIMEOUT (GPU tests, default 600), BATCHED (models for the
# batched-generation comparison, default mistral-7b:q4_k_m; empty: none), NPL (parallel sequences, default 32,128).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
Q="${QUARREL:-$ROOT/target/release/quarrel}"
TGZ="${LLAMA_TGZ:-$ROOT/.carry/llama/llama-trim.tgz}"
PARTS="${LLAMA_PARTS:-$ROOT/.carry/llamacuda}"
WORK="${WORK:-/tmp/qbench}"
OUT="${OUT:-$WORK/out}"
REPS="${REPS:-3}"
MODELS="${MODELS:-mistral-7b:q4_0 mistral-7b:q4_k_m tinyllama-1.1b:q4_0}"
DEVICE="${DEVICE:-cuda}"
BATCHED="${BATCHED-mistral-7b:q4_k_m}"   # set but empty: no batched comparison
NPL="${NPL:-32,128}"
TIMEOUT="${TIMEOUT:-300}"
mkdir -p "$WORK/models" "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
NPROC=$(nproc)
T0=$(date +%s)
log() { echo "[gpu-bench $(($(date +%s) - T0)) s] $*" >&2; }

# 1. llama.cpp: prebuilt, carried, or built in the background
LB=""
BUILD=""
if [ -n "${LLAMA_BIN:-}" ] && [ -x "$LLAMA_BIN/llama-bench" ]; then
    LB="$LLAMA_BIN/llama-bench"
elif ls "$PARTS"/llamacuda.part* >/dev/null 2>&1; then
    mkdir -p "$WORK/llamabin"
    if cat "$PARTS"/llamacuda.part* | xz -d | tar -x -C "$WORK/llamabin"; then
        LB="$WORK/llamabin/llamacuda/llama-bench"   # shared-library build; RPATH $ORIGIN
        [ -x "$LB" ] || LB="$WORK/llamabin/llama-bench"
    else
        echo "unpacking the carried llama.cpp from $PARTS failed"
    fi
elif [ -f "$TGZ" ] && [ "${LLAMA_BUILD:-1}" != 0 ]; then
    log "no prebuilt llama-bench: building llama.cpp from $TGZ in the background"
    (
        set -e
        mkdir -p "$WORK/llama" && tar -xzf "$TGZ" -C "$WORK/llama"
        src=$(dirname "$(find "$WORK/llama" -mindepth 2 -maxdepth 2 -name CMakeLists.txt | head -1)")
        cmake -S "$src" -B "$WORK/llama/b" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF \
            -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release >"$OUT/llama-cmake.log" 2>&1
        cmake --build "$WORK/llama/b" -j"$NPROC" --target llama-bench llama-batched-bench >"$OUT/llama-build.log" 2>&1
    ) &
    BUILD=$!
    LB="$WORK/llama/b/bin/llama-bench"
else
    echo "no llama.cpp (LLAMA_BIN, $PARTS or $TGZ): Quarrel's columns only"
fi

# 2. models, written in the background while the tests run
(
    for m in $MODELS; do
        p=${m%%:*}; q=${m#*:}; f="$WORK/models/$p-$q.gguf"
        [ -s "$f" ] || "$Q" synth --fast -p "$p" -q "$q" -t $((NPROC / 3 + 1)) "$f" >"$OUT/synth-$p-$q.log" 2>&1 || echo "synth $p $q failed" &
    done
    wait
) &
SYNTH=$!

# 3. GPU tests and copy bandwidth
if [ "${SKIP_TESTS:-0}" != 1 ] && { [ -n "${BIN_DIR:-}" ] || command -v cargo >/dev/null; }; then
    timeout "${TEST_TIMEOUT:-600}" "$ROOT/scripts/gpu-test.sh" >"$OUT/gpu-test.log" 2>&1 && echo "GPU tests: passed" || echo "GPU tests: FAILED (see $OUT/gpu-test.log)"
    grep -E "^(test |greedy|perplexity|.*worst logits)" "$OUT/gpu-test.log" | grep -v "^test result" | sed 's/^/  /'
    log "tests done"
fi
timeout 120 "$Q" gpu --copy-mib 2048 -r 20 | tee "$OUT/gpu.txt"
COPY=$(grep -oE '[0-9.]+ GB/s' "$OUT/gpu.txt" | head -1 | cut -d' ' -f1)

# 4. benchmarks: ours, then llama.cpp's (the build, if any, has had the tests' time)
wait $SYNTH
log "models written"
for m in $MODELS; do
    p=${m%%:*}; q=${m#*:}; f="$WORK/models/$p-$q.gguf"
    timeout "$TIMEOUT" "$Q" bench --device "$DEVICE" -m "$f" -p 512 -n 128 -r "$REPS" -o json >"$OUT/q-$p-$q.json" 2>"$OUT/q-$p-$q.err" ||
        echo "quarrel bench $p $q failed: $(tail -2 "$OUT/q-$p-$q.err")"
done
log "quarrel benchmarks done"
[ -n "$BUILD" ] && { wait $BUILD || { echo "llama.cpp build failed"; tail -20 "$OUT/llama-build.log"; }; }
for m in $MODELS; do
    p=${m%%:*}; q=${m#*:}; f="$WORK/models/$p-$q.gguf"
    [ -n "$LB" ] && [ -x "$LB" ] && timeout "$TIMEOUT" "$LB" -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -r "$REPS" -o json >"$OUT/l-$p-$q.json" 2>"$OUT/l-$p-$q.err"
done
log "llama.cpp benchmarks done"
# 4b. batched generation (issue 5's GPU figure): N parallel sequences, 128-token prompts, 128 generated
for m in $BATCHED; do
    p=${m%%:*}; q=${m#*:}; f="$WORK/models/$p-$q.gguf"
    [ -s "$f" ] || continue
    echo "== batched $p $q: llama-batched-bench"
    LBB="$(dirname "$LB")/llama-batched-bench"
    [ -x "$LBB" ] && timeout "$TIMEOUT" "$LBB" -m "$f" -ngl 99 -fa on -c 40000 -b 2048 -ub 512 -npp 128 -ntg 128 -npl "$NPL" 2>&1 | grep -E "^\|" | tee "$OUT/lb-$p-$q.txt"
    echo "== batched $p $q: quarrel batched-bench --device $DEVICE"
    timeout "$TIMEOUT" "$Q" batched-bench --device "$DEVICE" -m "$f" --npp 128 --ntg 128 --npl "$NPL" 2>&1 | grep -E "^\|" | tee "$OUT/qb-$p-$q.txt"
done
log "batched benchmarks done"

# 5. the table
PYTHONPATH="$ROOT/scripts" python3 - "$OUT" "${COPY:-}" $MODELS <<'PY'
import sys
from bench_table import TESTS, load, print_head
out, copy, models = sys.argv[1], sys.argv[2], sys.argv[3:]
print_head("llama.cpp t/s", "quarrel t/s", "ratio")
notes = []
for m in models:
    p, q = m.split(":")
    a, b = load(f"{out}/l-{p}-{q}.json"), load(f"{out}/q-{p}-{q}.json")
    for key, name in TESTS:
        la, qb = a.get(key, {}).get("avg_ts"), b.get(key, {}).get("avg_ts")
        r = f"{qb / la:.2f}x" if la and qb else "-"
        fmt = lambda v: f"{v:,.0f}" if v else "-"
        print(f"| {p} {q} | {name} | {fmt(la)} | {fmt(qb)} | {r} |")
    tg = b.get((0, 128))
    if tg and copy and p.startswith("mistral"):
        size = tg["model_size"]
        bw = size * tg["avg_ts"] / 1e9
        notes.append(f"{p} {q}: {size / 2**30:.2f} GiB of weights per token x {tg['avg_ts']:.0f} t/s = {bw:.0f} GB/s read; "
                     f"copy {float(copy):.0f} GB/s (read+write) -> {100 * bw / float(copy):.0f}% of the copy figure, "
                     f"ceiling {float(copy) * 1e9 / size:.0f} t/s")
print()
for n in notes:
    print(n)
PY
