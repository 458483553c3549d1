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


def engine_sample(metric, label, name, m=None):
    """The value of `metric` whose `label` is `name` (from `m`, or a fresh scrape)."""
    m = m or metrics()
    for k, v in m.items():
        if k.startswith(metric + "{") and f'{label}="{name}"' in k:
            return v
    raise KeyError(name)


def engine_gauge(name, m=None):
    return engine_sample("quarrel_engine", "gauge", name, m)


def engine_counter(name, m=None):
    return engine_sample("quarrel_engine_counter", "counter", name, m)


def wait_gauges_zero(names, timeout, poll=0.05):
    """Scrape every `poll` seconds until the engine gauges `names` are all 0, for at most
    `timeout` seconds: (whether they got there, the last scrape)."""
    t0 = time.time()
    m = None
    while time.time() - t0 < timeout:
        m = metrics()
        if all(engine_gauge(n, m) == 0 for n in names):
            return True, m
        time.sleep(poll)
    return False, m


def wait_idle(timeout=60):
    """Wait until no request runs or waits (earlier tests' streams are done)."""
    if not wait_gauges_zero(("running", "queue_depth"), timeout)[0]:
        raise AssertionError("the engine did not become idle")
