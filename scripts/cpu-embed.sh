#!/usr/bin/env bash
# Embedding throughput on this CPU, llama.cpp and Quarrel on the same file in one run: the 200
# texts of tests/fixtures/encoders/nomic-texts.txt (1 to 441 tokens, 25k tokens with
# nomic-embed's vocabulary), llama-embedding at several batch sizes (its best is the one to
# compare with; its time starts at its first batch, after loading) and `quarrel embed` (its own
# "embedded N texts in S s" line, which starts after loading too), twice each, alternating.
# Usage: scripts/cpu-embed.sh LLAMA_BIN_DIR MODEL [THREADS]
#   e.g. scripts/cpu-embed.sh ~/llama.cpp/build/bin "$(quarrel pull nomic-embed-text | tail -1)" 2
set -euo pipefail
L=${1:?LLAMA_BIN_DIR (llama.cpp build/bin)}
M=${2:?MODEL}
T=${3:-2}
Q=${QUARREL:-$(dirname "$0")/../target/release/quarrel}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
TEXTS=$(dirname "$0")/../tests/fixtures/encoders/nomic-texts.txt
cp "$TEXTS" "$W/texts.txt"
python3 -c 'import json, sys; [print(json.dumps({"id": str(i), "text": l.rstrip("\n")})) for i, l in enumerate(open(sys.argv[1], encoding="utf-8"))]' "$W/texts.txt" > "$W/texts.jsonl"
N=$(wc -l < "$W/texts.txt")
llama() {
  local b=$1 s e
  s=$(date +%s.%N)
  "$L/llama-embedding" -m "$M" -f "$W/texts.txt" -t "$T" -c "$b" -b "$b" -ub "$b" --pooling mean --embd-normalize 2 \
    --embd-output-format array > "$W/llama-out.txt" 2> "$W/llama-$b.log"
  e=$(date +%s.%N)
  python3 - "$W/llama-$b.log" "$s" "$e" "$b" "$N" <<'PY'
import re, sys
log, s, e, b, n = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
first = [l for l in open(log) if "batch_decode" in l]
m = re.match(r"(\d+)\.(\d+)\.(\d+)", first[0].split()[0]).groups()
run = (e - s) - (int(m[0]) * 60 + int(m[1]) + int(m[2]) / 1000)
print(f"| llama.cpp | llama-embedding -b {b} | {run:.1f} | {n / run:.2f} |")
PY
}
ours() {
  "$Q" embed -m "$M" -t "$T" --no-prefix --file "$W/texts.jsonl" -c 2048 > /dev/null 2> "$W/quarrel.log"
  tail -1 "$W/quarrel.log" | python3 -c 'import re, sys; l = sys.stdin.read(); n, s = re.search(r"embedded (\d+) texts in ([\d.]+) s", l).groups(); print(f"| Quarrel | quarrel embed | {float(s):.1f} | {int(n) / float(s):.2f} |")'
}
echo "$N texts, $T threads, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
echo "| engine | command | seconds | texts/s |"
echo "|---|---|---:|---:|"
for round in 1 2; do
  ours
  for b in 512 2048 8192; do llama "$b"; done
done
