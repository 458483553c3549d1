#!/usr/bin/env python3
"""`quarrel embed --flight` of many texts into the Longbow-like test peer (tests/flight_peer.py),
through `slow_down` answers and a dropped connection, then checks that every row arrived once
with its id, and reports texts/s.

Texts: N spans of 3 to 60 words of tests/fixtures/text/gpl-3.txt at seeded random places
(deterministic), ids `doc-<i>`. The peer answers `slow_down` to the first 3 batches and cuts
every data connection after a batch in the middle of the upload is stored (before its
acknowledgement), as crates/cli/tests/embed_flight.rs does with 1,000 texts.

Usage: scripts/embed-flight-load.py QUARREL MODEL N [quarrel embed flags ...]
  e.g. scripts/embed-flight-load.py target/release/quarrel nomic.gguf 100000 --device cuda --ubatch 8192
Needs pyarrow (with Flight) and numpy.
"""

import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.flight as fl

ROOT = Path(__file__).resolve().parent.parent
BATCH = 256


def texts(n):
    words = re.sub(r"\s+", " ", (ROOT / "tests/fixtures/text/gpl-3.txt").read_text()).split(" ")
    rng = random.Random(20261130)
    for i in range(n):
        k = rng.randrange(3, 61)
        at = rng.randrange(len(words) - k)
        yield i, " ".join(words[at : at + k])


def action(client, name, body=b""):
    return [r.body.to_pybytes() for r in client.do_action(fl.Action(name, body))]


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    quarrel, model, n, extra = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "texts.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for i, t in texts(n):
                f.write(json.dumps({"id": f"doc-{i}", "text": t}) + "\n")
        # the peer serves until its stdin closes
        peer = subprocess.Popen([sys.executable, str(ROOT / "tests/flight_peer.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            ready = peer.stdout.readline()
            m = re.match(r"READY data=(\d+) meta=(\d+)", ready)
            if not m:
                sys.exit(f"peer did not start: {ready!r}")
            data, meta = f"127.0.0.1:{m[1]}", f"127.0.0.1:{m[2]}"
            client = fl.connect(f"grpc://{meta}")
            batches = -(-n // BATCH)
            action(client, "peer.slow_down", b'{"batches": 3}')
            action(client, "peer.drop_after", json.dumps({"batches": max(1, batches // 2)}).encode())
            cmd = [quarrel, "embed", "-m", model, "--file", str(path), "--flight", data, "--meta", meta, "--dataset", "docs",
                   "--batch", str(BATCH), "--no-text", *extra]
            t0 = time.monotonic()
            run = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            secs = time.monotonic() - t0
            print("\n".join(run.stderr.strip().splitlines()[-3:]), flush=True)
            if run.returncode != 0:
                sys.exit(f"quarrel embed failed ({run.returncode}):\n{run.stderr}")
            stats = json.loads(action(client, "peer.stats")[0])["datasets"]["docs"]
            reader = fl.connect(f"grpc://{data}").do_get(fl.Ticket(json.dumps({"name": "docs"}).encode()))
            ids = reader.read_all().column("id").to_pylist()
            want = {f"doc-{i}" for i in range(n)}
            ok = stats["rows"] == n and stats["duplicate_ids"] == 0 and len(ids) == n and set(ids) == want
            drops = json.loads(action(client, "peer.stats")[0])["drops"]
            print(f"{n} texts in {secs:.1f} s ({n / secs:.1f} texts/s, whole command); peer: {stats['rows']} rows in "
                  f"{stats['batches']} batches, {stats['duplicate_ids']} duplicate ids, {drops} dropped connection(s); "
                  f"every id once: {ok}")
            sys.exit(0 if ok and drops >= 1 else 1)
        finally:
            peer.kill()


if __name__ == "__main__":
    main()
