#!/usr/bin/env bash
# Server integration tests: the official `openai` and `ollama` Python clients and a
# `websockets` client against running `quarrel serve` instances on loopback ports (one
# open, one with API keys, rate limits and CORS), serving the default model.
# Then a minute of tests/server/chaos.py and tests/server/long_context.py at a 2048 context.
# Usage: tests/server/run.sh  (needs target/release/quarrel and the default model pulled)
set -euo pipefail
cd "$(dirname "$0")/../.."
Q="${QUARREL_BIN:-$PWD/target/release/quarrel}"
VENV="${QUARREL_PYENV:-$PWD/target/pyenv}"
PKGS=("openai>=1.40" "ollama>=0.4" "websockets>=12" "jsonschema>=4")
if [ ! -x "$VENV/bin/python" ]; then
  # python3-venv may be missing (Debian): fall back to the user site below
  python3 -m venv "$VENV" >/dev/null 2>&1 || rm -rf "$VENV"
fi
if [ -x "$VENV/bin/python" ]; then
  PY="$VENV/bin/python"
  "$PY" -m pip install -q --disable-pip-version-check "${PKGS[@]}"
else
  PY=python3
  "$PY" -m pip install -q --disable-pip-version-check --user "${PKGS[@]}" 2>/dev/null \
    || "$PY" -m pip install -q --disable-pip-version-check --user --break-system-packages "${PKGS[@]}"
fi
WORK="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
P1="$(free_port)"; P2="$(free_port)"
"$Q" serve --port "$P1" -t 2 --log-format json >"$WORK/serve.log" 2>&1 &
pids+=($!)
"$Q" serve --port "$P2" -t 1 --kv-seqs 1 --keys "$WORK/keys.json" --rate-limit 5 --cors-origin http://example.test \
  --log-format json >"$WORK/serve-auth.log" 2>&1 &
pids+=($!)
for p in "$P1" "$P2"; do
  for _ in $(seq 1 120); do
    "$PY" -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)" "http://127.0.0.1:$p/readyz" >/dev/null 2>&1 && break
    sleep 0.5
  done
  "$PY" -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)" "http://127.0.0.1:$p/readyz" >/dev/null 2>&1 || { echo "server on $p did not start"; cat "$WORK"/serve*.log; exit 1; }
done
export QUARREL_URL="http://127.0.0.1:$P1" QUARREL_AUTH_URL="http://127.0.0.1:$P2" QUARREL_KEYS_FILE="$WORK/keys.json" QUARREL_BIN="$Q"
status=0
(cd tests/server && "$PY" -m unittest -v test_openai test_ollama test_ws test_errors test_auth test_embed_sharing test_tokenize_offload test_deploy_metrics test_structured test_utility test_tools) || status=$?
if [ "$status" -ne 0 ]; then
  echo "--- server log (last 40 lines)"; tail -n 40 "$WORK/serve.log"
  exit "$status"
fi
# a minute of the chaos test (faults beside a load test, then SIGTERM), and prompts of a full
# context sharing a cache of one context (queueing, preemption) against each prompt alone
"$PY" tests/server/chaos.py --duration 60 --clients 16
"$PY" tests/server/long_context.py --model smollm2 --ctx 2048
