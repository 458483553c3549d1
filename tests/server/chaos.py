"""Chaos test: a load test runs against `quarrel serve` while faults are injected, and the server
must keep every promise to everyone else.

    python3 tests/server/chaos.py [--duration 1800] [--clients 64] [--model smollm2]

Faults, each in its own thread for the whole run:
- clients that go away: streaming requests closed after a few events, waiting requests closed
  before their first token, connections reset (SO_LINGER 0);
- model churn: a second model (another name for the same file) loaded, used and unloaded while
  requests on it stream;
- bad models: a truncated GGUF, a GGUF whose header asks for 2^40 layers, a name that is no file;
- bad requests: broken JSON, wrong types, a prompt longer than the context, a wrong content type;
- slow clients: headers or a body that never finish (the server's timeouts must end them);
- embeddings: large /v1/embeddings requests, every other one abandoned half way;
- and at the end SIGTERM while streams run: every stream ends (done or an error event), the
  process exits 0 within its --shutdown-timeout.

Pass: the load test's requests all complete (no 5xx, no error, nothing lost); every fault
request ends with its expected answer (a 4xx JSON error, a clear error event, or the server
closing a connection it must close); in runs of ten minutes or more, the server's memory after warm-up stays flat."""
import argparse
import http.client
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import serving
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def gguf_huge_blocks(src, dst):
    """`src`'s metadata (no tensors) with `*.block_count` set to 2^40: parsing succeeds and
    the tokenizer loads, so only the loader's hyperparameter checks stand between this file
    and an allocation of 2^40 layers."""
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(src, "rb") as f:
        data = f.read()
    _, n_kv = struct.unpack_from("<QQ", data, 8)
    at = 24
    out = []

    def skip_value(t, at):
        if t in sizes:
            return at + sizes[t]
        if t == 8:
            return at + 8 + struct.unpack_from("<Q", data, at)[0]
        item, n = struct.unpack_from("<IQ", data, at)
        at += 12
        if item in sizes:
            return at + n * sizes[item]
        for _ in range(n):
            at = skip_value(item, at)
        return at
    for _ in range(n_kv):
        klen = struct.unpack_from("<Q", data, at)[0]
        key = data[at + 8:at + 8 + klen].decode()
        t = struct.unpack_from("<I", data, at + 8 + klen)[0]
        end = skip_value(t, at + 12 + klen)
        if key.endswith(".block_count"):
            out.append(data[at:at + 8 + klen] + struct.pack("<IQ", 10, 1 << 40))
        else:
            out.append(data[at:end])
        at = end
    with open(dst, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, n_kv) + b"".join(out))


class Tally:
    """Outcomes per fault kind; `bad` holds the ones that broke a promise."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ok = Counter()
        self.bad = []

    def good(self, kind, what="ok"):
        with self.lock:
            self.ok[(kind, what)] += 1

    def fail(self, kind, what):
        with self.lock:
            self.bad.append((time.strftime("%H:%M:%S"), kind, str(what)[:300]))


class Chaos:
    def __init__(self, args, base, model_path, tally, stop):
        self.args, self.base, self.model_path, self.t, self.stop = args, base, model_path, tally, stop
        self.host, self.port = "127.0.0.1", int(base.rsplit(":", 1)[1])
        self.rng = random.Random(7)

    def request(self, method, path, body=None, ctype="application/json", timeout=600):
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method, headers={"Content-Type": ctype})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode("utf-8", "replace")

    def expect_4xx(self, kind, method, path, body, ctype="application/json"):
        try:
            st, text = self.request(method, path, body, ctype)
        except OSError as e:
            return self.t.fail(kind, f"{path}: {e}")
        if 400 <= st < 500 and text.startswith("{") and "error" in text:
            self.t.good(kind, str(st))
        else:
            self.t.fail(kind, f"{path}: {st} {text[:200]}")

    def sleep(self, lo, hi):
        self.stop.wait(self.rng.uniform(lo, hi))

    def loop(self, fn, lo, hi):
        def run():
            while not self.stop.is_set():
                try:
                    fn()
                except Exception as e:  # a fault thread must never die silently
                    self.t.fail(fn.__name__, f"harness: {e!r}")
                self.sleep(lo, hi)
        th = threading.Thread(target=run, name=fn.__name__, daemon=True)
        th.start()
        return th

    # ---- faults ----
    def vanishing_clients(self):
        body = json.dumps({"model": self.args.model, "prompt": "Once upon a time", "max_tokens": 200,
                           "temperature": 0.7, "stream": self.rng.random() < 0.7}).encode()
        c = http.client.HTTPConnection(self.host, self.port, timeout=120)
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        stream = b'"stream": true' in body
        if stream:
            r = c.getresponse()
            if r.status != 200:
                return self.t.fail("vanish", f"stream status {r.status}")
            for _ in range(self.rng.randint(1, 12)):
                r.fp.readline()
        else:
            time.sleep(self.rng.uniform(0.0, 2.0))
        if self.rng.random() < 0.5:  # reset instead of a clean close
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.sock.close()
        c.close()
        self.t.good("vanish", "stream" if stream else "waiting")

    def model_churn(self):
        st, text = self.request("POST", "/api/models/churn/load")
        if st != 200:
            return self.t.fail("churn", f"load: {st} {text[:200]}")
        self.t.good("churn", "loaded")
        results = []

        def use():
            try:
                results.append(self.request("POST", "/v1/completions", {"model": "churn", "prompt": "Tell me a story",
                                                                         "max_tokens": 400, "stream": True}))
            except OSError as e:
                results.append((0, repr(e)))
        users = [threading.Thread(target=use) for _ in range(2)]
        for u in users:
            u.start()
        time.sleep(self.rng.uniform(0.5, 4.0))
        st, text = self.request("DELETE", "/api/models/churn/load")
        if st != 200:
            self.t.fail("churn", f"unload: {st} {text[:200]}")
        for u in users:
            u.join(300)
        for st, text in results:
            # a stream cut by the unload ends with an error event; one that finished first has its done event
            if st == 200 and ("[DONE]" in text or '"error"' in text):
                self.t.good("churn", "stream cut" if '"error"' in text else "stream done")
            elif 400 <= st < 600 and st != 500 and '"error"' in text:
                self.t.good("churn", f"refused {st}")
            else:
                self.t.fail("churn", f"use: {st} {text[-200:]}")

    def bad_models(self):
        name = self.rng.choice(["bad-truncated", "bad-blocks", "no-such-model"])
        st, text = self.request("POST", "/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": "hi"}]})
        # a broken file in the models directory is the server's fault (500, ollama answers the
        # same); the error must name the file and the reason
        want = (404, "model_not_found") if name == "no-such-model" else (500, "model_load_failed")
        if st == want[0] and want[1] in text and (name == "no-such-model" or f"{name}.gguf" in text):
            self.t.good("bad-model", f"{name} {st}")
        else:
            self.t.fail("bad-model", f"{name}: {st} {text[:300]}")

    def bad_requests(self):
        m = self.args.model
        cases = [
            (b"{nope", "application/json"),
            (json.dumps({"model": m, "messages": "not a list"}).encode(), "application/json"),
            (json.dumps({"model": m, "prompt": "x", "max_tokens": "ten"}).encode(), "application/json"),
            (json.dumps({"model": m, "prompt": "word " * 9000, "max_tokens": 4}).encode(), "application/json"),
            (json.dumps({"model": m, "prompt": "hi"}).encode(), "text/plain"),
            (json.dumps({"model": m, "prompt": "hi", "temperature": -3}).encode(), "application/json"),
        ]
        body, ctype = self.rng.choice(cases)
        path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
        self.expect_4xx("bad-request", "POST", path, body, ctype)

    def slow_clients(self):
        s = socket.create_connection((self.host, self.port), timeout=60)
        try:
            if self.rng.random() < 0.5:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never end
                what = "headers"
            else:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 100000\r\n\r\n{\"prompt\": \"")  # body never ends
                what = "body"
            t0 = time.time()
            data = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            took = time.time() - t0
            limit = self.args.slow_timeout * 3 + 5
            if took <= limit:
                self.t.good("slow-client", f"{what} closed")
            else:
                self.t.fail("slow-client", f"{what}: closed after {took:.0f} s")
        except socket.timeout:
            self.t.fail("slow-client", "never closed")
        finally:
            s.close()

    def embeddings(self):
        text = " ".join(f"word{i % 97} and more" for i in range(40))
        body = json.dumps({"model": self.args.model, "input": [f"{i}: {text}" for i in range(16)]}).encode()
        c = http.client.HTTPConnection(self.host, self.port, timeout=1200)
        c.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
        if self.rng.random() < 0.5:
            time.sleep(self.rng.uniform(0.5, 3.0))
            c.close()
            return self.t.good("embeddings", "abandoned")
        r = c.getresponse()
        data = r.read()
        c.close()
        if r.status == 200 and len(json.loads(data)["data"]) == 16:
            self.t.good("embeddings", "complete")
        else:
            self.t.fail("embeddings", f"{r.status} {data[:200]}")


def rss_mib(pid):
    """Anonymous resident memory: the heap, KV caches and repacked weights, not the pages of
    memory-mapped model files (which come and go with the page cache and the churned model)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return 0.0


def sigterm_phase(base, model, proc, tally, deadline):
    """Streams running, then SIGTERM: each stream ends with its done or an error event, and the
    process exits 0 before its shutdown deadline."""
    host, port = "127.0.0.1", int(base.rsplit(":", 1)[1])
    ends = []

    def stream():
        c = http.client.HTTPConnection(host, port, timeout=deadline + 60)
        body = json.dumps({"model": model, "prompt": "Write a long story about the sea", "max_tokens": 2000,
                           "temperature": 0.7, "stream": True})
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        text = r.read().decode("utf-8", "replace")
        ends.append((r.status, text))
    ths = [threading.Thread(target=stream) for _ in range(16)]
    for th in ths:
        th.start()
    time.sleep(5)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=deadline + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = None
    took = time.time() - t0
    for th in ths:
        th.join(60)
    if rc != 0 or took > deadline + 5:
        tally.fail("sigterm", f"exit {rc} after {took:.1f} s (deadline {deadline} s)")
    else:
        tally.good("sigterm", f"exit 0 in {took:.0f} s")
    for st, text in ends:
        if st == 200 and ("[DONE]" in text or '"error"' in text):
            tally.good("sigterm", "stream ended")
        else:
            tally.fail("sigterm", f"stream: {st} {text[-200:]}")
    if len(ends) != len(ths):
        tally.fail("sigterm", f"{len(ths) - len(ends)} streams never ended")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("QUARREL_BIN", os.path.join(ROOT, "target/release/quarrel")))
    ap.add_argument("--model", default="smollm2", help="model name or path (the load test's)")
    ap.add_argument("-d", "--duration", type=float, default=1800)
    ap.add_argument("-c", "--clients", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--slow-timeout", type=int, default=5, help="the server's header and body timeouts")
    ap.add_argument("--shutdown-timeout", type=int, default=20)
    ap.add_argument("--kv-seqs", type=int, default=2,
                    help="the server's KV cache in full contexts: small, so that its pages are all touched early and growth "
                         "after warm-up means a leak, and so that the load runs at the cache's limit")
    ap.add_argument("--json", help="write the summary here")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="quarrel-chaos-")
    path = subprocess.run([args.bin, "pull", args.model], capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1] \
        if not os.path.exists(args.model) else args.model
    models = os.path.join(work, "models")
    os.makedirs(models)
    os.symlink(os.path.abspath(path), os.path.join(models, "churn.gguf"))
    with open(path, "rb") as f, open(os.path.join(models, "bad-truncated.gguf"), "wb") as g:
        g.write(f.read(1 << 20))
    gguf_huge_blocks(path, os.path.join(models, "bad-blocks.gguf"))

    flags = ["-m", path, "--models-dir", models, "--parallel", str(args.clients),
             "--header-timeout", str(args.slow_timeout), "--body-timeout", str(args.slow_timeout),
             "--shutdown-timeout", str(args.shutdown_timeout), "--timeout", "900", "--kv-seqs", str(args.kv_seqs),
             "--log-format", "json"]
    proc, base = serving.start(args.bin, flags, os.path.join(work, "serve.log"), args.threads)
    model = serving.default_model(base)
    args.model = model

    tally, stop = Tally(), threading.Event()
    chaos = Chaos(args, base, path, tally, stop)
    t_start = time.time()
    lt_json = os.path.join(work, "loadtest.json")
    load = subprocess.Popen([args.bin, "loadtest", "--url", base, "-m", model, "-c", str(args.clients), "-d", str(args.duration),
                             "--max-tokens", str(args.max_tokens), "--json", lt_json],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    threads = [chaos.loop(chaos.vanishing_clients, 0.5, 2.0), chaos.loop(chaos.vanishing_clients, 0.5, 2.0),
               chaos.loop(chaos.model_churn, 5, 20), chaos.loop(chaos.bad_models, 1, 5),
               chaos.loop(chaos.bad_requests, 0.2, 1.0), chaos.loop(chaos.slow_clients, 1, 5),
               chaos.loop(chaos.embeddings, 5, 30)]
    samples = []
    while load.poll() is None:
        samples.append((time.time() - t_start, rss_mib(proc.pid)))
        print(f"\r{samples[-1][0]:6.0f} s  rss {samples[-1][1]:7.1f} MiB  faults ok {sum(tally.ok.values())}  broken {len(tally.bad)}",
              end="", flush=True)
        time.sleep(5)
    print()
    stop.set()
    for th in threads:
        th.join(300)
    lt_out = load.stdout.read()
    report = json.load(open(lt_json))
    sigterm_phase(base, model, proc, tally, args.shutdown_timeout)

    # memory: after a warm-up of a sixth of the run, the last third's floor (the churned model
    # unloaded, no embeddings) and its peak may not rise above the middle's
    warm = args.duration / 6
    mid = [r for t, r in samples if warm <= t < args.duration * 2 / 3]
    late = [r for t, r in samples if t >= args.duration * 2 / 3]
    mem_ok = bool(mid and late) and min(late) <= min(mid) * 1.05 + 16 and max(late) <= max(mid) * 1.05 + 16
    # a run of minutes is all warm-up (the KV cache's pages are still being touched): reported only
    mem_checked = args.duration >= 600
    summary = {
        "duration_s": args.duration, "clients": args.clients,
        "load": {k: report[k] for k in ("requests", "complete", "errors", "incomplete", "retries", "errors_by_kind", "generated_tokens_per_s")},
        "ttft_ms": report["ttft"], "faults_ok": {f"{k}/{w}": n for (k, w), n in sorted(tally.ok.items())},
        "faults_broken": tally.bad, "rss_mib": {"start": samples[0][1] if samples else 0,
                                                "middle_min_max": [min(mid), max(mid)] if mid else [],
                                                "last_third_min_max": [min(late), max(late)] if late else [],
                                                "flat": mem_ok, "checked": mem_checked},
    }
    summary["rss_mib"]["samples"] = [[round(t), round(r, 1)] for t, r in samples]
    print(lt_out)
    print("| seconds | anonymous RSS min MiB | max MiB |\n|---|---:|---:|")
    step = max(args.duration / 10, 5)
    for i in range(10):
        w = [r for t, r in samples if i * step <= t < (i + 1) * step]
        if w:
            print(f"| {i * step:.0f}-{(i + 1) * step:.0f} | {min(w):.0f} | {max(w):.0f} |")
    print(json.dumps({k: v for k, v in summary.items() if k != "rss_mib"} | {"rss_mib": {k: v for k, v in summary["rss_mib"].items() if k != "samples"}}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    ok = report["errors"] == 0 and report["incomplete"] == 0 and report["requests"] > 0 and not tally.bad and (mem_ok or not mem_checked)
    print("OK" if ok else f"FAIL (server log: {work}/serve.log)")
    if ok:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
