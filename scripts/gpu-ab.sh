#!/usr/bin/env bash
# Two Quarrel binaries on the same GPU and the same synthetic files, in one run: for a change
# that must not move speed (a restructuring, a refactor), pp512 / tg128 of each binary side by
# side and their ratio. The binaries alternate model by model, each with `-r REPS`.
#
#   scripts/gpu-ab.sh OLD_BINARY NEW_BINARY [MODEL:QUANT ...]
#
# Models default to the dense and MoE / hybrid files of scripts/gpu-bench.sh and
# scripts/gpu-moe-bench.sh (written with OLD_BINARY's `synth --fast` into $WORK/models, reused
# when present; MoE files take ~50 GB: DELETE_AFTER=1 removes each file after its rows).
# Environment: WORK (default /tmp/qab), REPS (default 3), TIMEOUT (seconds per bench, default 300),
# NUMERICS (default: each binary's own default for the model).
set -uo pipefail
OLD=${1:?usage: gpu-ab.sh OLD NEW [MODEL:QUANT ...]}
NEW=${2:?usage: gpu-ab.sh OLD NEW [MODEL:QUANT ...]}
shift 2
MODELS=${*:-"tinyllama-1.1b:q4_0 mistral-7b:q4_0 mistral-7b:q4_k_m granite-4.0-h-tiny:q4_k_m nemotron-3-nano-30b-a3b:q4_k_m mixtral-8x7b:q4_k_m"}
WORK=${WORK:-/tmp/qab}
REPS=${REPS:-3}
TIMEOUT=${TIMEOUT:-300}
mkdir -p "$WORK/models" "$WORK/out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
log() { echo "[gpu-ab $(($(date +%s) - T0)) s] $*" >&2; }
NUM=()
[ -n "${NUMERICS:-}" ] && NUM=(--numerics "$NUMERICS")

bench() { # binary tag model-file -> json in $WORK/out
    timeout "$TIMEOUT" "$1" bench --device cuda -m "$3" "${NUM[@]}" -p 512 -n 128 -r "$REPS" -o json \
        >"$WORK/out/$2.json" 2>"$WORK/out/$2.err" || echo "bench $2 failed: $(tail -2 "$WORK/out/$2.err")" >&2
}

for m in $MODELS; do
    p=${m%%:*}; q=${m#*:}; f="$WORK/models/$p-$q.gguf"
    if [ ! -s "$f" ]; then
        log "writing $p $q"
        "$OLD" synth --fast --quiet -p "$p" -q "$q" -t "$(nproc)" "$f" || { echo "synth $p $q failed" >&2; continue; }
    fi
    log "bench $p $q"
    bench "$OLD" "old-$p-$q" "$f"
    bench "$NEW" "new-$p-$q" "$f"
    [ "${DELETE_AFTER:-0}" = 1 ] && rm -f "$f"
done

PYTHONPATH="$(dirname "$0")" python3 - "$WORK/out" $MODELS <<'PY'
import sys
from bench_table import TESTS, load, print_head
out, models = sys.argv[1], sys.argv[2:]
print_head("old t/s", "new t/s", "new / old")
for m in models:
    p, q = m.split(":")
    a, b = load(f"{out}/old-{p}-{q}.json"), load(f"{out}/new-{p}-{q}.json")
    for key, name in TESTS:
        x, y = a.get(key, {}).get("avg_ts"), b.get(key, {}).get("avg_ts")
        f = lambda v: f"{v:,.1f}" if v else "-"
        print(f"| {p} {q} | {name} | {f(x)} | {f(y)} | {y / x:.3f} |" if x and y else f"| {p} {q} | {name} | {f(x)} | {f(y)} | - |")
PY
