"""Chat latency beside a very large embeddings request: the same load test runs twice against one
server, alone and next to one /v1/embeddings request of many inputs, and the chat requests'
time to first token must stay within a factor of the first run's.

    python3 tests/server/embed_fairness.py [--inputs 1000] [--clients 4] [--duration 60] [--bound 2]

Exits 1 when TTFT p99 beside the embeddings exceeds `--bound` times TTFT p99 alone, when a chat
request fails, or when the embeddings request did not run through the second load test."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import serving

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def loadtest(args, base, out):
    subprocess.run([args.bin, "loadtest", "--url", base, "-c", str(args.clients), "-d", str(args.duration),
                    "--max-tokens", "16", "--json", out, "--strict"], check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("QUARREL_BIN", os.path.join(ROOT, "target/release/quarrel")))
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--inputs", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("-d", "--duration", type=float, default=60)
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("--device", default="")
    ap.add_argument("--bound", type=float, default=2.0)
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="quarrel-fair-")
    flags = ["-m", args.model, "--timeout", "3600", "--max-body-bytes", str(64 << 20), "--max-prompt-bytes", str(64 << 20)]
    proc, base = serving.start(args.bin, flags, os.path.join(work, "serve.log"), args.threads, args.device)
    try:
        model = serving.default_model(base)
        loadtest(args, base, os.path.join(work, "warm.json"))  # caches, page-ins, allocator
        alone = loadtest(args, base, os.path.join(work, "alone.json"))

        # inputs of one to three sentences, all different
        words = "the of and to in is that for it as with was on be by this are from at or an".split()
        inputs = [f"Document {i}: " + " ".join(words[(i * 7 + j) % len(words)] for j in range(12 + i % 40))
                  for i in range(args.inputs)]
        emb = {}

        def embed():
            body = json.dumps({"model": model, "input": inputs}).encode()
            req = urllib.request.Request(base + "/v1/embeddings", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            t0 = time.time()
            with urllib.request.urlopen(req, timeout=7200) as r:
                data = json.loads(r.read())
            emb.update(status=r.status, n=len(data["data"]), tokens=data["usage"]["prompt_tokens"], secs=time.time() - t0)
        th = threading.Thread(target=embed)
        t_start = time.time()
        th.start()
        time.sleep(1)
        beside = loadtest(args, base, os.path.join(work, "beside.json"))
        t_load_end = time.time()
        th.join()
    finally:
        proc.terminate()
        proc.wait(60)

    ratio = beside["ttft"]["p99_ms"] / max(alone["ttft"]["p99_ms"], 1e-9)
    print(f"| chat load ({args.clients} clients, {args.duration:.0f} s) | requests | TTFT p50 ms | TTFT p99 ms | tokens/s |")
    print("|---|---:|---:|---:|---:|")
    for name, r in (("alone", alone), (f"beside {args.inputs} embedding inputs", beside)):
        print(f"| {name} | {r['complete']} | {r['ttft']['p50_ms']:.0f} | {r['ttft']['p99_ms']:.0f} | {r['generated_tokens_per_s']:.1f} |")
    print(f"\nembeddings: {emb.get('n')} vectors, {emb.get('tokens')} tokens in {emb.get('secs', 0):.1f} s; "
          f"TTFT p99 ratio {ratio:.2f} (bound {args.bound})")
    ok = ratio <= args.bound and emb.get("n") == args.inputs and t_start + emb.get("secs", 0) >= t_load_end
    if emb.get("n") == args.inputs and t_start + emb["secs"] < t_load_end:
        print("FAIL: the embeddings finished before the load test did: use more --inputs")
    print("OK" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
