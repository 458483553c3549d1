#!/usr/bin/env bash
# Speed of Quarrel against llama.cpp on the same models, threads and tests: the one way every
# speed claim in this project is made.
#
#   scripts/bench-vs-llamacpp.sh LLAMA_BENCH MODEL.gguf... [-t LIST] [-p LIST] [-n LIST] [-r N]
#
#   LLAMA_BENCH  path to llama.cpp's llama-bench binary
#   MODEL.gguf   one or more GGUF files (the same files go to both tools)
#   -t LIST      thread counts, llama-bench syntax (`2`, `1,2,4`)   default: nproc
#   -p LIST      prompt lengths (ppN tests; 0 = none)                default: 512
#   -n LIST      generation lengths (tgN tests; 0 = none)            default: 128
#   -r N         repetitions per test (after one warm-up run)        default: 5
#
# Environment:
#   QUARREL   the quarrel binary to measure (default: `cargo build --release` and
#             target/release/quarrel; speed claims are release builds)
#   OUT_DIR   where the raw JSON and logs go (default: a new temporary directory)
#
# For every model, the tools run alternately, test kind by test kind (llama-bench pp, quarrel
# pp, llama-bench tg, quarrel tg), so that drifting machine load hits both alike. Both use
# llama-bench's protocol (see `quarrel bench --help`) and `-o json`; the t/s compared are
# llama-bench's avg_ts ± stddev_ts. stdout: one markdown table (model, threads, test,
# llama.cpp t/s, quarrel t/s, ratio = quarrel / llama.cpp) and a few lines of context.
set -euo pipefail

usage() {
    sed -n '5,12p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

[ $# -ge 2 ] || usage
LLAMA_BENCH="$1"
shift
[ -x "$LLAMA_BENCH" ] || { echo "error: llama-bench not found or not executable: $LLAMA_BENCH" >&2; exit 2; }

THREADS="$(nproc)"
PROMPT=512
GEN=128
REPS=5
MODELS=()
while [ $# -gt 0 ]; do
    case "$1" in
        -t|--threads) [ $# -ge 2 ] || usage; THREADS="$2"; shift 2 ;;
        -p|--n-prompt) [ $# -ge 2 ] || usage; PROMPT="$2"; shift 2 ;;
        -n|--n-gen) [ $# -ge 2 ] || usage; GEN="$2"; shift 2 ;;
        -r|--repetitions) [ $# -ge 2 ] || usage; REPS="$2"; shift 2 ;;
        -h|--help) usage ;;
        -*) echo "error: unknown option $1" >&2; usage ;;
        *) [ -f "$1" ] || { echo "error: model not found: $1" >&2; exit 2; }
           MODELS+=("$1"); shift ;;
    esac
done
[ ${#MODELS[@]} -gt 0 ] || { echo "error: no model given" >&2; usage; }
command -v python3 >/dev/null || { echo "error: python3 is needed to read the JSON" >&2; exit 2; }

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ -z "${QUARREL:-}" ]; then
    echo "building quarrel (release)..." >&2
    (cd "$ROOT" && cargo build --release --bin quarrel >&2)
    QUARREL="$ROOT/target/release/quarrel"
fi
[ -x "$QUARREL" ] || { echo "error: quarrel binary not found: $QUARREL" >&2; exit 2; }

OUT_DIR="${OUT_DIR:-$(mktemp -d -t bench-vs-llamacpp.XXXXXX)}"
mkdir -p "$OUT_DIR"
echo "raw results and logs: $OUT_DIR" >&2
LOAD_START="$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"

# run TOOL NAME ARGS...: TOOL's JSON to $OUT_DIR/NAME.json, its stderr to NAME.log
run() {
    local tool="$1" name="$2"
    shift 2
    echo "  $name: $*" >&2
    if ! "$tool" "$@" -o json >"$OUT_DIR/$name.json" 2>"$OUT_DIR/$name.log"; then
        echo "error: $name failed; the end of $OUT_DIR/$name.log:" >&2
        tail -n 20 "$OUT_DIR/$name.log" >&2
        exit 1
    fi
}

i=0
for m in "${MODELS[@]}"; do
    i=$((i + 1))
    echo "model $i/${#MODELS[@]}: $m" >&2
    common=(-m "$m" -t "$THREADS" -r "$REPS")
    if [ "$PROMPT" != 0 ]; then
        run "$LLAMA_BENCH" "llamacpp-$i-pp" "${common[@]}" -p "$PROMPT" -n 0
        run "$QUARREL" "quarrel-$i-pp" bench "${common[@]}" -p "$PROMPT" -n 0
    fi
    if [ "$GEN" != 0 ]; then
        run "$LLAMA_BENCH" "llamacpp-$i-tg" "${common[@]}" -p 0 -n "$GEN"
        run "$QUARREL" "quarrel-$i-tg" bench "${common[@]}" -p 0 -n "$GEN"
    fi
done

python3 - "$OUT_DIR" "$LOAD_START" "$(nproc)" <<'PY'
import glob, json, os, sys

out_dir, load_start, nproc = sys.argv[1:4]

def load(prefix):
    rows = []
    for f in sorted(glob.glob(os.path.join(out_dir, prefix + "-*.json"))):
        with open(f) as fh:
            rows.extend(json.load(fh))
    return rows

def key(r):
    return (os.path.realpath(r["model_filename"]), int(r["n_threads"]), int(r["n_prompt"]), int(r["n_gen"]))

lc = {key(r): r for r in load("llamacpp")}
qr = {key(r): r for r in load("quarrel")}
if not lc or not qr:
    sys.exit("error: no results to compare")

def test(p, g):
    return f"pp{p}" if g == 0 else f"tg{g}" if p == 0 else f"pp{p}+tg{g}"

def ts(r):
    return f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}" if r else "—"

order = list(dict.fromkeys(list(lc) + list(qr)))
# by model (first appearance), then threads, then pp before tg, then length
models = list(dict.fromkeys(k[0] for k in order))
order.sort(key=lambda k: (models.index(k[0]), k[1], k[2] == 0, k[2], k[3]))
rows = []
for k in order:
    a, b = lc.get(k), qr.get(k)
    ratio = f"{b['avg_ts'] / a['avg_ts']:.2f}" if a and b and a["avg_ts"] > 0 else "—"
    rows.append([os.path.basename(k[0]), str(k[1]), test(k[2], k[3]), ts(a), ts(b), ratio])

head = ["model", "threads", "test", "llama.cpp t/s", "quarrel t/s", "ratio"]
right = [False, True, True, True, True, True]
w = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
cell = lambda i, c: f" {c:>{w[i]}} |" if right[i] else f" {c:<{w[i]}} |"
print("|" + "".join(cell(i, h) for i, h in enumerate(head)))
print("|" + "".join(f" {'-' * (w[i] - 1)}{':' if right[i] else '-'} |" for i in range(len(head))))
for r in rows:
    print("|" + "".join(cell(i, c) for i, c in enumerate(r)))

any_l = next(iter(lc.values()))
any_q = next(iter(qr.values()))
reps = len(any_q.get("samples_ns", []))
print()
print(f"ratio = quarrel / llama.cpp (avg t/s); {reps} repetitions after a warm-up, llama-bench protocol.")
print(f"llama.cpp: build {any_l.get('build_commit', '?')} ({any_l.get('build_number', '?')}), backends {any_l.get('backends', '?')}")
print(f"quarrel: {any_q.get('quarrel_version', '?')} (build {any_q.get('build_commit', '?')}), {any_q.get('backend', '?')}")
print(f"cpu: {any_l.get('cpu_info') or any_q.get('cpu_info') or '?'}, {nproc} cores; load average at start: {load_start}")
loads = {}
for r in qr.values():
    loads.setdefault(os.path.basename(r["model_filename"]), []).append(r.get("load_ms", 0))
print("quarrel load time (not in t/s): " + ", ".join(f"{m} {min(v):.0f} ms" for m, v in loads.items()))
PY
