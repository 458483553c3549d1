#!/usr/bin/env bash
# Runs every fuzz target (or the ones named) for a fixed time each and fails on the first crash,
# timeout or out-of-memory. The corpus grows under fuzz/corpus/<target> (seeded from
# fuzz/seeds/<target>); findings land in fuzz/artifacts/<target>.
#
#   scripts/fuzz.sh [-t SECONDS] [TARGET...]     default: 60 s per target, all targets
#
# Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=60
if [ "${1:-}" = "-t" ]; then secs="$2"; shift 2; fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo +nightly fuzz list)
cargo +nightly fuzz build -O
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  seeds=()
  [ -d "seeds/$t" ] && seeds=("seeds/$t")
  echo "== $t: ${secs}s"
  # -timeout: one input may take at most 10 s; -rss_limit_mb: memory per run
  status=0
  cargo +nightly fuzz run -O "$t" "corpus/$t" "${seeds[@]}" -- \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 >"$log" 2>&1 || status=$?
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb|ERROR|SUMMARY|Test unit written|panicked" "$log" || true
  if [ "$status" -ne 0 ] || ls "artifacts/$t"/* >/dev/null 2>&1; then
    tail -n 30 "$log" >&2
    echo "$t: finding (exit $status), see fuzz/artifacts/$t" >&2
    exit 1
  fi
done
echo "all targets ran ${secs}s each without a finding"
