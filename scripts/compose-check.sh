#!/usr/bin/env bash
# End-to-end check of deploy/compose.yaml on a machine with Docker: starts Quarrel (the CPU
# image) and Prometheus, creates an API key, drives a short load test through the API, and
# asks Prometheus for the TTFT histogram it scraped; then stops everything.
#
#   scripts/compose-check.sh [MODEL.gguf]     (default: SmolLM2-135M-Instruct, `quarrel pull smollm2`)
#
# Needs docker compose (v2 plugin or docker-compose 1.29), the images' base
# (scripts/docker-base.sh) and a quarrel binary on the PATH or in QUARREL (for `pull` and the
# load test). The images are built as compose.yaml says; QUARREL_BUILD=prebuilt uses
# target/dist/quarrel instead of compiling in the image. Grafana is not started here (its image
# comes from Docker Hub).
set -euo pipefail
cd "$(dirname "$0")/.."
Q=${QUARREL:-$(command -v quarrel || echo target/dist/quarrel)}
MODEL=${1:-$("$Q" pull smollm2 | tail -1)}
if docker compose version >/dev/null 2>&1; then DC=(docker compose); else DC=(docker-compose); fi
DATA=$(mktemp -d)
mkdir -p "$DATA/models"
cp "$MODEL" "$DATA/models/"
chown -R 10001:10001 "$DATA"
export QUARREL_DATA=$DATA
PROJECT=quarrel-check
dc() { "${DC[@]}" -f deploy/compose.yaml -p "$PROJECT" "$@"; }
cleanup() {
  dc down -v >/dev/null 2>&1 || true
  rm -rf "$DATA"
}
trap cleanup EXIT
dc up -d --build quarrel prometheus
name=$(basename "$MODEL" .gguf)
echo "waiting for /readyz ..."
for _ in $(seq 1 120); do
  curl -fsS localhost:8080/readyz >/dev/null 2>&1 && break
  sleep 1
done
curl -fsS localhost:8080/readyz
echo
KEY=$(dc exec -T quarrel quarrel keys create compose-check 2>/dev/null | tail -n 1 | tr -d '\r')
[ -n "$KEY" ] || { echo "no API key was created" >&2; exit 1; }
echo "completion:"
curl -fsS -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' localhost:8080/v1/completions \
  -d "{\"model\": \"$name\", \"prompt\": \"The capital of France is\", \"max_tokens\": 16, \"temperature\": 0}"
echo
"$Q" loadtest --url http://localhost:8080 --api-key "$KEY" -m "$name" -c 4 -n 24 --max-tokens 32 --strict
echo "waiting for Prometheus to scrape ..."
q='sum(quarrel_time_to_first_token_seconds_count)'
for _ in $(seq 1 60); do
  n=$(curl -fsS "localhost:9090/api/v1/query" --data-urlencode "query=$q" |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(int(float(r[0]["value"][1])) if r else 0)')
  [ "$n" -gt 0 ] && break
  sleep 2
done
echo "Prometheus: $q = $n"
curl -fsS "localhost:9090/api/v1/query" --data-urlencode \
  'query=histogram_quantile(0.95, sum by (le) (quarrel_time_to_first_token_seconds_bucket))'
echo
curl -fsS localhost:9090/api/v1/rules | python3 -c 'import json,sys; g=json.load(sys.stdin)["data"]["groups"]; print("Prometheus rule groups:", len(g), "rules:", sum(len(x["rules"]) for x in g))'
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E '^quarrel(-prometheus)?:'
[ "$n" -gt 0 ] || { echo "Prometheus has no TTFT samples" >&2; exit 1; }
echo "compose: ok"
