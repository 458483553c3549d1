#!/usr/bin/env bash
# Quarrel's CUDA backend against llama.cpp on one GPU machine, in one run:
#   1. builds llama.cpp (CUDA) from a source tarball, in the background;
#   2. writes synthetic models with real shapes (`quarrel synth`): Mistral-7B Q4_0 and Q4_K_M,
#      TinyLlama-1.1B Q4_0;
#   3. runs the GPU test suite (scripts/gpu-test.sh) and measures device-to-device copy bandwidth;
#   4. runs `quarrel bench --device cuda` and `llama-bench -ngl 99 -fa 1` on the same files;
#   5. prints one table: pp512 / tg128 of both, the ratios, and the 7B decode bandwidth.
#
# Environment: QUARREL (the quarrel binary; default target/release/quarrel), LLAMA_TGZ (llama.cpp
# source .tgz; default .carry/llama/llama-trim.tgz), BIN_DIR (prebuilt test binaries, see
# gpu-test.sh), WORK (scratch folder for models and the build; default /tmp/qbench),
# OUT (where logs go; default $WORK/out), REPS (repetitions, default 3), MODELS (subset),
# DEVICE (quarrel's --device, default cuda; cpu for a dry run of the script).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
Q="${QUARREL:-$ROOT/target/release/quarrel}"
TGZ="${LLAMA_TGZ:-$ROOT/.carry/llama/llama-trim.tgz}"
WORK="${WORK:-/tmp/qbench}"
OUT="${OUT:-$WORK/out}"
REPS="${REPS:-3}"
MODELS="${MODELS:-mistral-7b:q4_0 mistral-7b:q4_k_m tinyllama-1.1b:q4_0}"
DEVICE="${DEVICE:-cuda}"
mkdir -p "$WORK/models" "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
NPROC=$(nproc)

# 1. llama.cpp, in the background (skipped when the source tarball is absent)
BUILD=""
if [ -f "$TGZ" ]; then
    (
        set -e
        mkdir -p "$WORK/llama" && tar -xzf "$TGZ" -C "$WORK/llama"
        src=$(dirname "$(find "$WORK/llama" -mindepth 2 -maxdepth 2 -name CMakeLists.txt | head -1)")
        cmake -S "$src" -B "$WORK/llama/b" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF \
            -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release >"$OUT/llama-cmake.log" 2>&1
        cmake --build "$WORK/llama/b" -j"$NPROC" --target llama-bench >"$OUT/llama-build.log" 2>&1
    ) &
    BUILD=$!
else
    echo "llama.cpp source $TGZ not found: quarrel only"
fi

# 2. models, written in the background while the tests run
(
    for m in $MODELS; do
        p=${m%%:*}; q=${m#*:}; f="$WORK/models/$p-$q.gguf"
        [ -s "$f" ] || "$Q" synth -p "$p" -q "$q" -t $((NPROC / 4 + 1)) "$f" >"$OUT/synth-$p-$q.log" 2>&1 || echo "synth $p $q failed" &
    done
    wait
) &
SYNTH=$!

# 3. GPU tests and copy bandwidth
if [ -n "${BIN_DIR:-}" ] || command -v cargo >/dev/null; then
    "$ROOT/scripts/gpu-test.sh" >"$OUT/gpu-test.log" 2>&1 && echo "GPU tests: passed" || echo "GPU tests: FAILED (see $OUT/gpu-test.log)"
    grep -E "^(test |greedy|perplexity|.*worst logits)" "$OUT/gpu-test.log" | grep -v "^test result" | sed 's/^/  /'
fi
"$Q" gpu --copy-mib 2048 -r 20 | tee "$OUT/gpu.txt"
COPY=$(grep -oE '[0-9.]+ GB/s' "$OUT/gpu.txt" | head -1 | cut -d' ' -f1)

# 4. benchmarks: ours, then llama.cpp's once built
wait $SYNTH
for m in $MODELS; do
    p=${m%%:*}; q=${m#*:}; f="$WORK/models/$p-$q.gguf"
    "$Q" bench --device "$DEVICE" -m "$f" -p 512 -n 128 -r "$REPS" -o json >"$OUT/q-$p-$q.json" 2>"$OUT/q-$p-$q.err" || echo "quarrel bench $p $q failed: $(tail -2 "$OUT/q-$p-$q.err")"
done
[ -n "$BUILD" ] && { wait $BUILD || { echo "llama.cpp build failed"; tail -20 "$OUT/llama-build.log"; }; }
LB="$WORK/llama/b/bin/llama-bench"
for m in $MODELS; do
    p=${m%%:*}; q=${m#*:}; f="$WORK/models/$p-$q.gguf"
    [ -x "$LB" ] && "$LB" -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -r "$REPS" -o json >"$OUT/l-$p-$q.json" 2>"$OUT/l-$p-$q.err"
done

# 5. the table
python3 - "$OUT" "$COPY" $MODELS <<'PY'
import json, sys, os
out, copy, models = sys.argv[1], sys.argv[2], sys.argv[3:]
def load(path):
    try:
        return {(r["n_prompt"], r["n_gen"]): r for r in json.load(open(path))}
    except Exception:
        return {}
print()
print("| model | test | llama.cpp t/s | quarrel t/s | ratio |")
print("|---|---|---:|---:|---:|")
notes = []
for m in models:
    p, q = m.split(":")
    a, b = load(f"{out}/l-{p}-{q}.json"), load(f"{out}/q-{p}-{q}.json")
    for key, name in [((512, 0), "pp512"), ((0, 128), "tg128")]:
        la, qb = a.get(key, {}).get("avg_ts"), b.get(key, {}).get("avg_ts")
        r = f"{qb / la:.2f}x" if la and qb else "-"
        print(f"| {p} {q} | {name} | {la or 0:,.0f} | {qb or 0:,.0f} | {r} |")
    tg = b.get((0, 128))
    if tg and copy and p.startswith("mistral"):
        size = tg["model_size"]
        bw = size * tg["avg_ts"] / 1e9
        notes.append(f"{p} {q}: {size / 2**30:.2f} GiB of weights per token x {tg['avg_ts']:.0f} t/s = {bw:.0f} GB/s read; "
                     f"copy {float(copy):.0f} GB/s (read+write) -> {100 * bw / float(copy):.0f}% of the copy figure, "
                     f"ceiling {float(copy) * 1e9 / size:.0f} t/s")
for n in notes:
    print(n)
PY
