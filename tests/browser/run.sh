#!/usr/bin/env bash
# Browser tests of the web chat UI (issue 8): installs headless Chromium (Debian package) and
# playwright-core (npm, pinned by package-lock.json) when missing, then runs the tests against a
# `quarrel serve` they start on a free loopback port with the default model.
# Env: QUARREL_BIN (the built binary), QUARREL_TEST_MODEL (a .gguf; else the server's default).
# Screenshots land in tests/browser/out/ (BROWSER_TEST_OUT), not committed.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v chromium >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
if [ ! -d node_modules/playwright-core ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
export CHROMIUM="${CHROMIUM:-$(command -v chromium)}"
exec node --test --test-concurrency=1 --test-reporter=spec chat.test.mjs
