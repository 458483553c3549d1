"""Long prompts at the KV cache's limit: prompts up to the model's full context share a paged KV
cache that holds one context's worth of tokens, so the scheduler must queue and preempt; every
greedy result must be exactly the one the same prompt gives alone.

Two rounds on the tight server: four prompts of the full, half and a third of the context at
once (they cannot all be resident: queueing), then four prompts of a quarter context each,
block-aligned, that fill the cache exactly, so that the first generated tokens need blocks no
one has (preemption and recomputation).

    python3 tests/server/long_context.py [--model gemma3] [--ctx 32768] [--device cuda:0]

Starts two servers one after the other: a tight one (`--kv-seqs 1`, every request admitted at
once) and a roomy one that serves each prompt alone, with no prefix cache so nothing is shared.
Exits 1 when a result differs, a request fails, or nothing was preempted."""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import serving

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sentences():
    with open(os.path.join(ROOT, "tests/fixtures/text/gpl-3.txt"), encoding="utf-8") as f:
        text = " ".join(f.read().split())
    return [s for s in re.split(r"(?<=[.;:])\s+", text) if s]


def prompt_ids(args, seed, n_tokens):
    """`n_tokens` token ids of text made by shuffling the licence's sentences (seeded, so every
    prompt differs from its first token on and no prefix is shared)."""
    rng = random.Random(seed)
    pool = sentences()
    words = []
    while len(" ".join(words)) < n_tokens * 6:
        rng.shuffle(pool)
        words.extend(pool)
    text = " ".join(words)
    out = subprocess.run([args.bin, "tokenize", "-m", args.model, "--ids", "--stdin"], input=text.encode(),
                         capture_output=True, check=True)
    ids = json.loads(out.stdout)
    assert len(ids) >= n_tokens, f"text gave {len(ids)} tokens, need {n_tokens}"
    return ids[:n_tokens]


class Server:
    def __init__(self, args, extra, log):
        flags = ["-m", args.model, "--ctx", str(args.ctx), "--timeout", "3600",
                 "--max-prompt-bytes", str(16 << 20), "--max-body-bytes", str(16 << 20)] + extra
        self.proc, self.base = serving.start(args.bin, flags, log, args.threads, args.device)

    def complete(self, ids, max_tokens):
        body = json.dumps({"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "logprobs": 1}).encode()
        req = urllib.request.Request(self.base + "/v1/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=7200) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode("utf-8", "replace")

    def counter(self, name):
        with urllib.request.urlopen(self.base + "/metrics", timeout=30) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("quarrel_engine_counter{") and f'counter="{name}"' in line:
                    return float(line.rsplit(" ", 1)[1])
        return 0.0

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=120)


def result(status, r):
    """What must match: generated text, token ids (from logprobs) and the finish reason."""
    if status != 200:
        return ("error", status, str(r)[:300])
    c = r["choices"][0]
    return (c["text"], c["logprobs"]["tokens"] if c.get("logprobs") else None, c["finish_reason"],
            r["usage"]["prompt_tokens"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("QUARREL_BIN", os.path.join(ROOT, "target/release/quarrel")))
    ap.add_argument("--model", default="gemma3")
    ap.add_argument("--ctx", type=int, default=32768, help="context length (the model must allow it)")
    ap.add_argument("--device", default="", help="as `quarrel serve --device` (default: the server's)")
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("-n", "--max-tokens", type=int, default=16)
    args = ap.parse_args()

    n = args.ctx - args.max_tokens
    rounds = [[n, n // 2, n // 2 - 7, n // 3], [args.ctx // 4] * 4]
    lengths = [length for r in rounds for length in r]
    t0 = time.time()
    prompts = [prompt_ids(args, seed, length) for seed, length in enumerate(lengths)]
    print(f"prompts: {rounds} tokens (made in {time.time() - t0:.1f} s)", flush=True)

    work = tempfile.mkdtemp()
    tight = Server(args, ["--kv-seqs", "1", "--parallel", "4"], os.path.join(work, "tight.log"))
    got = [None] * len(prompts)

    def one(i):
        got[i] = result(*tight.complete(prompts[i], args.max_tokens))

    t0 = time.time()
    first, per_round = 0, []
    for r in rounds:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(first, first + len(r))]
        first += len(r)
        for t in threads:
            t.start()
            time.sleep(0.2)  # arrival order = list order
        for t in threads:
            t.join()
        per_round.append(tight.counter("preemptions") - sum(per_round))
    t_tight = time.time() - t0
    preemptions = tight.counter("preemptions")
    tight.stop()

    roomy = Server(args, ["--kv-seqs", "1", "--parallel", "1", "--no-prefix-cache"], os.path.join(work, "roomy.log"))
    t0 = time.time()
    want = [result(*roomy.complete(p, args.max_tokens)) for p in prompts]
    t_alone = time.time() - t0
    roomy.stop()

    print("\n| prompt tokens | together == alone | generated text (alone) |\n|---:|---|---|")
    ok = True
    for length, g, w in zip(lengths, got, want):
        same = g == w and w[0] != "error"
        ok &= same
        print(f"| {length} | {'yes' if same else 'NO'} | {json.dumps(w[0])[:60]} |")
        if not same:
            print(f"  together: {g}\n  alone:    {w}")
    print(f"\ntogether: {t_tight:.1f} s, preemptions per round {[int(p) for p in per_round]}; one by one: {t_alone:.1f} s")
    if preemptions < 1:
        print("FAIL: the tight cache preempted nothing: the test did not reach the KV limit")
        ok = False
    print("OK" if ok else f"FAIL (server logs in {work})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
