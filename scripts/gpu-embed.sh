#!/usr/bin/env bash
# Embedding encoders on a GPU machine, llama.cpp and Quarrel on the same files in one run:
#   1. llama.cpp (CUDA) from the trimmed source .carry/llama/llama-trim.tgz: libllama and
#      llama-embedding (~4 min on 16 cores);
#   2. the model: nomic-embed-text-v1.5's shape at F16 (quarrel synth, with the real WordPiece
#      vocabulary from VOCAB), or MODEL when given (e.g. the real nomic-embed-text-v1.5);
#   3. accuracy: the 200 texts of tests/fixtures/encoders/nomic-texts.txt embedded by llama.cpp
#      (scripts/embed_fixtures.c, every layer on the GPU) and by `quarrel embed --device cuda`:
#      tokens and cosine per text;
#   4. throughput: 1,000 texts (those 200, five times), `llama-embedding -ngl 99` with its
#      whole batch in one ubatch vs `quarrel embed --device cuda`, three runs each: texts/s.
# Usage: QUARREL=bin/quarrel VOCAB=vocab.gguf [MODEL=file.gguf] scripts/gpu-embed.sh OUTDIR
set -uo pipefail
OUT=${1:?OUTDIR}
mkdir -p "$OUT"
T0=$(date +%s)
export PATH=/usr/local/cuda/bin:$PATH
W=/tmp/lw; mkdir -p $W && tar -xzf .carry/llama/llama-trim.tgz -C $W
src=$(dirname "$(find $W -mindepth 2 -maxdepth 2 -name CMakeLists.txt | head -1)")
(cmake -S "$src" -B $W/b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DBUILD_SHARED_LIBS=ON \
  -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DCMAKE_BUILD_TYPE=Release > $OUT/cmake.log 2>&1 && cmake --build $W/b -j14 --target llama llama-embedding > $OUT/build.log 2>&1; echo "llama.cpp built: $?") &
BUILD=$!
M=${MODEL:-/tmp/nomic-shape.gguf}
if [ -z "${MODEL:-}" ]; then
  "$QUARREL" synth -p nomic-embed-text-v1.5 -q f16 --seed 7 --vocab-from "$VOCAB" $M > $OUT/synth.log 2>&1 || { tail $OUT/synth.log; exit 1; }
fi
ls -la $M
wait $BUILD
tail -3 $OUT/build.log
L=$W/b/bin
cc -O2 -o /tmp/embed_fixtures scripts/embed_fixtures.c -I$src/include -I$src/ggml/include -L$L -lllama -lm -Wl,-rpath,$L || exit 1
TEXTS=tests/fixtures/encoders/nomic-texts.txt
python3 - "$TEXTS" > /tmp/texts.jsonl <<'PY'
import json, sys
for i, line in enumerate(open(sys.argv[1], encoding="utf-8").read().split("\n")[:-1]):
    print(json.dumps({"id": str(i), "text": line}))
PY
if [ -z "${ONLY_THROUGHPUT:-}" ]; then
/tmp/embed_fixtures $M $OUT/llama-cuda.json CUDA texts $TEXTS || echo "llama.cpp reference failed"
"$QUARREL" embed -m $M --device cuda --no-prefix --file /tmp/texts.jsonl -c 2048 --ubatch 8192 --batch 1000 > /tmp/ours.jsonl 2> $OUT/ours-accuracy.log
tail -2 $OUT/ours-accuracy.log
python3 - $OUT/llama-cuda.json /tmp/ours.jsonl "$M" <<'PY'
import json, sys, numpy as np
ref = json.load(open(sys.argv[1]))["items"]
ours = [json.loads(l)["vector"] for l in open(sys.argv[2])]
cos = [float(np.dot(r["embedding"], o)) for r, o in zip(ref, ours)]
print(f"accuracy {sys.argv[3]}: {len(cos)} texts, worst cosine vs llama.cpp (CUDA) {min(cos):.7f}, mean {np.mean(cos):.7f}")
PY
# the BERT-family arches on both backends: tiny synthetic models, CPU vs CUDA
for p in tiny-bert tiny-nomic-bert; do
  "$QUARREL" synth -p $p -q f32 --seed 7 /tmp/$p.gguf > /dev/null 2>&1
  python3 -c 'import json,sys; [print(json.dumps({"id": str(i), "text": json.loads(l)["text"][:120]})) for i, l in enumerate(open("/tmp/texts.jsonl")) if i < 50]' > /tmp/t50.jsonl
  "$QUARREL" embed -m /tmp/$p.gguf --no-prefix --file /tmp/t50.jsonl > /tmp/$p-cpu.jsonl 2>$OUT/$p-cpu.log
  "$QUARREL" embed -m /tmp/$p.gguf --device cuda --no-prefix --file /tmp/t50.jsonl > /tmp/$p-cuda.jsonl 2>$OUT/$p-cuda.log
  python3 - /tmp/$p-cpu.jsonl /tmp/$p-cuda.jsonl $p <<'PY'
import json, sys, numpy as np
a = [json.loads(l)["vector"] for l in open(sys.argv[1])]
b = [json.loads(l)["vector"] for l in open(sys.argv[2])]
cos = [float(np.dot(x, y)) for x, y in zip(a, b)]
print(f"{sys.argv[3]}: CPU vs CUDA, {len(cos)} texts, worst cosine {min(cos) if cos else float('nan'):.7f}")
PY
done
fi
for i in 1 2 3 4 5; do cat $TEXTS; done > /tmp/texts1000.txt
python3 -c 'import json; [print(json.dumps({"id": str(i), "text": l.rstrip("\n")})) for i, l in enumerate(open("/tmp/texts1000.txt", encoding="utf-8"))]' > /tmp/texts1000.jsonl
echo "throughput: 1000 texts, $(wc -c < /tmp/texts1000.txt) bytes"
# llama-embedding at several batch sizes (its best is reported): one ubatch per batch, at most
# 256 sequences per batch; its time is the wall time after loading (its log's first batch)
for b in 512 2048 8192 32768; do
  s=$(date +%s.%N)
  $L/llama-embedding -m $M -f /tmp/texts1000.txt -ngl 99 -c $b -b $b -ub $b --pooling mean --embd-normalize 2 --embd-output-format array > /tmp/llama-out.txt 2> $OUT/llama-embedding-$b.log
  e=$(date +%s.%N)
  python3 - $OUT/llama-embedding-$b.log $s $e $b <<'PY'
import re, sys
log, s, e, b = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
first = [l for l in open(log) if "batch_decode" in l]
m, sec = re.match(r"(\d+)\.(\d+)\.(\d+)", first[0].split()[0]).groups(), None
start = int(m[0]) * 60 + int(m[1]) + int(m[2]) / 1000
run = (e - s) - start
print(f"llama-embedding -b {b}: {len(first)} batches, {run:.2f} s after loading, {1000 / run:.1f} texts/s (wall {e - s:.2f} s)")
PY
done
# Quarrel at each --batch of QUARREL_BATCHES (texts per embedding call; several calls are in
# flight at once), three runs each
for b in ${QUARREL_BATCHES:-64 1000}; do
  for r in 1 2 3; do
    "$QUARREL" embed -m $M --device cuda --no-prefix --file /tmp/texts1000.jsonl -c 2048 --ubatch 8192 --batch $b > /dev/null 2> $OUT/quarrel-embed-$b-$r.log
    echo "quarrel embed --batch $b run $r: $(tail -1 $OUT/quarrel-embed-$b-$r.log)"
  done
done
echo "total $(( $(date +%s) - T0 )) s"
