#!/usr/bin/env bash
# Speculative decoding on the CPU, Quarrel and llama.cpp on the same pair in one run:
# SmolLM2-135M-Instruct at F16 (`quarrel quantize` of the published Q4_1 file) as the model,
# the Q4_1 file as the drafter; greedy, 128 tokens, two prompts (a story, a code rewrite).
# Prints tokens/s without and with the drafter (Quarrel: `quarrel run`, with and without
# --draft-model, checking that the text is the same; llama.cpp: `llama-speculative`) and the
# share of drafts accepted.
# Usage: LLAMA_BIN=<dir with llama-speculative> [QUARREL=target/release/quarrel] [THREADS=2]
#        scripts/bench-speculative.sh [WORKDIR]
set -euo pipefail
Q=${QUARREL:-target/release/quarrel}
L=${LLAMA_BIN:?LLAMA_BIN=directory holding llama-speculative (llama.cpp build/bin)}
T=${THREADS:-2}
W=${1:-/tmp/quarrel-spec-bench}
mkdir -p "$W"
D=$("$Q" pull smollm2 | tail -1)
M=$W/smollm2-f16.gguf
[ -f "$M" ] || "$Q" quantize --quiet --allow-requantize "$D" "$M" F16
chatml() { printf '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n' "$1"; }
chatml "Write a short story about a lighthouse keeper who finds a message in a bottle." > "$W/story.txt"
chatml 'Rewrite this Python code so that the function is named total_price instead of compute, and print the whole code:

def compute(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item["price"] * item["quantity"]
    tax = subtotal * tax_rate
    total = subtotal + tax
    return round(total, 2)

cart = [{"price": 2.5, "quantity": 4}, {"price": 10.0, "quantity": 1}]
print(compute(cart, 0.08))' > "$W/code.txt"
tps() { grep -o 'generated: [0-9]* tokens, [0-9.]* t/s' "$1" | awk '{print $4}'; }
acc() { grep -o 'drafts: [0-9]*/[0-9]* accepted ([0-9]*%)' "$1" | grep -o '([0-9]*%)' | tr -d '()'; }
echo "| prompt | side | without t/s | with t/s | ratio | accepted | same text |"
echo "|---|---|---:|---:|---:|---:|---|"
for p in story code; do
  run() { "$Q" run --raw -m "$M" -t "$T" --temp 0 -n 128 --ignore-eos -p "$(cat "$W/$p.txt")" "$@"; }
  run > "$W/$p-plain.out" 2> "$W/$p-plain.err"
  run --draft-model "$D" > "$W/$p-spec.out" 2> "$W/$p-spec.err"
  a=$(tps "$W/$p-plain.err"); b=$(tps "$W/$p-spec.err")
  same=$(cmp -s "$W/$p-plain.out" "$W/$p-spec.out" && echo yes || echo NO)
  echo "| $p | quarrel | $a | $b | $(python3 -c "print(f'{$b/$a:.2f}')") | $(acc "$W/$p-spec.err") | $same |"
  "$L/llama-speculative" -m "$M" -md "$D" -f "$W/$p.txt" -n 128 -t "$T" --temp 0 -c 1024 --ignore-eos \
    --spec-draft-n-max 8 > "$W/$p-llama.out" 2> "$W/$p-llama.err" || true
  ls=$(grep -o 'decoded .* speed: *[0-9.]*' "$W/$p-llama.err" | awk '{print $NF}')
  la=$(grep -o ' accept *= *[0-9.]*%' "$W/$p-llama.err" | awk '{print $NF}' | tr -d '%')
  echo "| $p | llama.cpp llama-speculative (--spec-draft-n-max 8) | | $ls | | ${la}% | |"
done
