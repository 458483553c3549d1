#!/usr/bin/env bash
# Test data llama.cpp ships in its source, taken from the llama-cpp-python 0.3.36 source on PyPI
# and cached in $QUARREL_HOME/testdata; prints that folder (the tests read it as QUARREL_TESTDATA):
#   vocab/      models/ggml-vocab-{qwen2,llama-bpe,phi-3,bert-bge}.gguf, each with .inp / .out texts and
#               the ids Hugging Face's tokenizers give them
#   templates/  models/templates/*.jinja: the chat templates of the models llama.cpp tests
#   grammars/   grammars/*.gbnf: llama.cpp's sample grammars
set -euo pipefail
DIR="${QUARREL_HOME:-$HOME/.cache/quarrel}/testdata"
VOCABS="qwen2 llama-bpe phi-3 bert-bge"
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
have() {
    for n in $VOCABS; do
        [ -s "$DIR/vocab/ggml-vocab-$n.gguf" ] && [ -s "$DIR/vocab/ggml-vocab-$n.gguf.out" ] || return 1
    done
    [ -s "$DIR/templates/Qwen-Qwen3-0.6B.jinja" ] && [ -s "$DIR/grammars/c.gbnf" ]
}
if ! have; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download --quiet --no-deps llama-cpp-python==0.3.36 -d "$tmp" >&2
    sdist="$tmp/llama_cpp_python-0.3.36.tar.gz"
    echo "$SHA256  $sdist" | sha256sum -c --quiet - >&2 || { echo "llama-cpp-python 0.3.36: unexpected checksum" >&2; exit 1; }
    pats=("*/vendor/llama.cpp/models/templates/*.jinja" "*/vendor/llama.cpp/grammars/*.gbnf")
    for n in $VOCABS; do pats+=("*/vendor/llama.cpp/models/ggml-vocab-$n.gguf*"); done
    tar -xzf "$sdist" -C "$tmp" --wildcards "${pats[@]}"
    mkdir -p "$DIR/vocab" "$DIR/templates" "$DIR/grammars"
    find "$tmp" -name 'ggml-vocab-*' -exec cp {} "$DIR/vocab/" \;
    find "$tmp" -path '*/models/templates/*.jinja' -exec cp {} "$DIR/templates/" \;
    find "$tmp" -path '*/grammars/*.gbnf' -exec cp {} "$DIR/grammars/" \;
    have || { echo "test data missing from the llama-cpp-python source" >&2; exit 1; }
fi
echo "$DIR"
