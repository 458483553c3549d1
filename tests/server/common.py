"""Shared helpers for the server integration tests: the servers under test (started by
run.sh) are given by environment variables; raw HTTP helpers use only the standard library."""
import json
import os
import re
import time
import urllib.error
import urllib.request

BASE = os.environ.get("QUARREL_URL", "http://127.0.0.1:18080")
AUTH_BASE = os.environ.get("QUARREL_AUTH_URL", "")
MODEL = os.environ.get("QUARREL_MODEL_NAME", "smollm2")
QUARREL_BIN = os.environ.get("QUARREL_BIN", "target/release/quarrel")
KEYS_FILE = os.environ.get("QUARREL_KEYS_FILE", "")


def raw(method, path, body=None, headers=None, base=None):
    """(status, headers, parsed JSON or text) without raising on 4xx/5xx."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    headers = dict(headers or {})
    if method == "POST" and not any(k.lower() == "content-type" for k in headers):
        # what real clients send; the server refuses other types on its JSON routes (415)
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request((base or BASE) + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            status, hdrs, text = r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        status, hdrs, text = e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()
    try:
        return status, hdrs, json.loads(text)
    except ValueError:
        return status, hdrs, text.decode("utf-8", "replace")


def metrics(base=None):
    """Prometheus samples as {'name{labels}': value}."""
    with urllib.request.urlopen((base or BASE) + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def engine_gauge(name, m=None):
    m = m or metrics()
    for k, v in m.items():
        if k.startswith("quarrel_engine{") and f'gauge="{name}"' in k:
            return v
    raise KeyError(name)


def engine_counter(name, m=None):
    m = m or metrics()
    for k, v in m.items():
        if k.startswith("quarrel_engine_counter{") and f'counter="{name}"' in k:
            return v
    raise KeyError(name)


def wait_idle(timeout=60):
    """Wait until no request runs or waits (earlier tests' streams are done)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        m = metrics()
        if engine_gauge("running", m) == 0 and engine_gauge("queue_depth", m) == 0:
            return
        time.sleep(0.05)
    raise AssertionError("the engine did not become idle")
