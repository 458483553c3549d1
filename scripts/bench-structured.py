#!/usr/bin/env python3
"""Cost of structured output: time per decoded token with and without a JSON schema, at 1
and at 16 concurrent streaming requests, against a running `quarrel serve` (both sides in
the same run, alternating, so machine load hits both alike).

Usage: scripts/bench-structured.py [--url http://127.0.0.1:8080] [--model NAME]
       [--concurrency 1,16] [--rounds 3] [--max-tokens 96]
Time per decoded token of a request = (last token time - first token time) / (tokens - 1),
from the SSE stream; the figure is the median over requests. Standard library only."""
import argparse
import json
import statistics
import threading
import time
import urllib.request

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 5},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"]},
    },
    "required": ["name", "age", "hobbies", "address"],
}


def one(url, model, max_tokens, schema, seed, out):
    body = {"model": model, "messages": [{"role": "user", "content": "Describe a fictional person as JSON with name, age, hobbies and address."}],
            "max_tokens": max_tokens, "temperature": 0.7, "seed": seed, "stream": True}
    if schema:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    times = []
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("choices") and ev["choices"][0]["delta"].get("content"):
                times.append(time.perf_counter())
    if len(times) >= 2:
        out.append((times[-1] - times[0]) / (len(times) - 1))


def batch(url, model, max_tokens, schema, conc, seed0):
    out = []
    ts = [threading.Thread(target=one, args=(url, model, max_tokens, schema, seed0 + i, out)) for i in range(conc)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--model", default="")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    a = ap.parse_args()
    print(f"{'concurrent':>10} {'plain ms/token':>15} {'schema ms/token':>16} {'ratio':>6}")
    for conc in [int(c) for c in a.concurrency.split(",")]:
        batch(a.url, a.model, 8, True, conc, 0)  # warm-up: token table, caches
        plain, constrained = [], []
        for r in range(a.rounds):
            plain += batch(a.url, a.model, a.max_tokens, False, conc, 100 * r)
            constrained += batch(a.url, a.model, a.max_tokens, True, conc, 100 * r)
        p, s = statistics.median(plain) * 1e3, statistics.median(constrained) * 1e3
        print(f"{conc:>10} {p:>15.2f} {s:>16.2f} {s / p:>6.3f}")


if __name__ == "__main__":
    main()
