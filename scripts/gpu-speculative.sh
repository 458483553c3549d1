#!/usr/bin/env bash
# Speculative decoding on a GPU machine, one run:
#   1. a Mistral-7B-shape target (Q8_0) and a drafter with the same weights at Q4_0
#      (`quarrel synth`, one seed, two types);
#   2. batch 1: `quarrel run --device cuda` greedy, 128 tokens, without speculation (fast and
#      invariant numerics) and with the drafter at several --draft-max: tokens/s, acceptance,
#      and whether the text is the one plain decoding gives;
#   3. serving: `quarrel serve --parallel 32` driven by `quarrel loadtest` at 32, 4 and 1
#      clients, without and with the drafter: generated tokens/s and latency percentiles.
# Usage: QUARREL=bin/quarrel [ONLY_SERVE=1] [CLIENTS="32 4 1"] scripts/gpu-speculative.sh OUTDIR
set -uo pipefail
OUT=${1:?OUTDIR}
mkdir -p "$OUT"
Q=${QUARREL:?QUARREL=path to the quarrel binary}
T=/tmp/spec-target.gguf
D=/tmp/spec-draft.gguf
[ -f $T ] || "$Q" synth --fast -p mistral-7b -q q8_0 --seed 11 $T > $OUT/synth.log 2>&1 || { tail $OUT/synth.log; exit 1; }
[ -f $D ] || "$Q" synth --fast -p mistral-7b -q q4_0 --seed 11 $D >> $OUT/synth.log 2>&1 || { tail $OUT/synth.log; exit 1; }
ls -la $T $D
P="Once upon a time in a small village by the sea, there lived an old fisherman who"
run() {
  local name=$1; shift
  "$Q" run --raw --device cuda -m $T --temp 0 -n 128 --ignore-eos -p "$P" "$@" > $OUT/$name.txt 2> $OUT/$name.err
  echo "$name: $(grep -o 'generated: .*' $OUT/$name.err)"
}
if [ -z "${ONLY_SERVE:-}" ]; then
run plain-fast --numerics fast
run plain-invariant --numerics invariant
for m in 4 16; do
  run spec-$m --draft-model $D --draft-max $m
  cmp -s $OUT/plain-invariant.txt $OUT/spec-$m.txt && echo "  spec-$m: same text as plain (invariant)" || echo "  spec-$m: TEXT DIFFERS"
done
fi
serve() {
  local name=$1; shift
  "$Q" serve --device cuda -m $T --port 18181 --parallel 32 --kv-seqs 32 -c 1024 --no-auth --log-format text "$@" > $OUT/serve-$name.log 2>&1 &
  local pid=$!
  for _ in $(seq 1 120); do curl -sf localhost:18181/readyz > /dev/null && break; sleep 1; done
  "$Q" loadtest --url http://127.0.0.1:18181 -c ${SPEC_CLIENTS:-32} -d 30 --max-tokens 128 --temperature 0 --prompt "$P" --json $OUT/load-$name.json > $OUT/load-$name.txt 2>&1
  echo "serve $name:"; tail -12 $OUT/load-$name.txt
  curl -s localhost:18181/metrics | grep 'counter="spec_' || true
  kill $pid; wait $pid 2>/dev/null
}
for c in ${CLIENTS:-32 4 1}; do
  SPEC_CLIENTS=$c serve plain-$c
  SPEC_CLIENTS=$c serve spec-$c --draft-model $D
done
