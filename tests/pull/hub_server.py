#!/usr/bin/env python3
"""A local stand-in for the Hugging Face hub and an ollama registry, serving files from a folder,
for the `quarrel pull` tests (crates/cli/tests/pull.rs).

Layout of --root:
  hf/ORG/REPO/PATH...          the files of hub repository ORG/REPO (revision main)
  ollama/NAMESPACE/NAME/TAG.gguf  the model layer of ollama model NAMESPACE/NAME:TAG

Hub routes, with the headers the hub sends:
  GET  /api/models/ORG/REPO/tree/REV[?recursive=true]  entries with size, oid and lfs.oid (sha256)
  HEAD/GET /ORG/REPO/resolve/REV/PATH  a .gguf (stored in LFS on the hub) answers 302 to the
       content store (/_lfs/SHA256 on a second port: another origin, as the hub's CDN is) with
       X-Linked-Etag, X-Linked-Size and X-Repo-Commit;
       other files answer directly with ETag and X-Repo-Commit. Range requests are honoured.
  Repositories of the organisation "private" answer 401 without `Authorization: Bearer TOKEN`.
Registry routes:
  GET /v2/NS/NAME/manifests/TAG   a manifest whose model layer's digest is the file's sha256
  GET /v2/NS/NAME/blobs/sha256:HEX  307 to the content store
Faults and counters (for the tests):
  GET /_control?cut=FILE&at=N[&delay=S]  the next response carrying FILE's byte N is cut there
                                (once), S seconds after sending the bytes before it
  GET /_control?corrupt=FILE    FILE is served with one byte changed (hashes stay the original's)
  GET /_control?reset=1         no faults, counters zeroed
  GET /_stats                   {"bytes": {FILE: body bytes sent}, "requests": [...]}
FILE is a file's base name. Prints `PORT <n>` on stdout once listening.
"""

import argparse
import hashlib
import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
MODEL_LAYER = "application/vnd.ollama.image.model"


class State:
    def __init__(self, root, token):
        self.root = root
        self.token = token
        self.lock = threading.Lock()
        self.cuts = {}  # base name -> (byte offset, seconds to wait before cutting)
        self.corrupt = set()
        self.bytes = {}
        self.requests = []
        self.sha = {}  # path -> sha256

    def sha256(self, path):
        with self.lock:
            if path in self.sha:
                return self.sha[path]
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        with self.lock:
            self.sha[path] = h.hexdigest()
        return self.sha[path]

    def by_sha(self, sha):
        for dirpath, _, files in os.walk(self.root):
            for f in files:
                p = os.path.join(dirpath, f)
                if self.sha256(p) == sha:
                    return p
        return None


def git_blob_sha1(path):
    data = open(path, "rb").read()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: State = None
    cdn = ""  # the content store's origin

    def log_message(self, fmt, *args):
        pass

    def send_json(self, code, obj, headers=()):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, code, msg):
        self.send_json(code, {"error": msg}, [("X-Error-Message", msg)])

    def redirect(self, code, location, headers=()):
        self.send_response(code)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()

    def do_HEAD(self):
        self.route()

    def do_GET(self):
        self.route()

    def route(self):
        st = self.state
        url = urlsplit(self.path)
        path = unquote(url.path)
        q = parse_qs(url.query)
        with st.lock:
            st.requests.append(f"{self.command} {self.path} range={self.headers.get('Range')}")
        parts = [p for p in path.split("/") if p]
        if path == "/_control":
            with st.lock:
                if "reset" in q:
                    st.cuts.clear()
                    st.corrupt.clear()
                    st.bytes.clear()
                    st.requests.clear()
                if "cut" in q:
                    st.cuts[q["cut"][0]] = (int(q["at"][0]), float(q.get("delay", ["0"])[0]))
                if "corrupt" in q:
                    st.corrupt.add(q["corrupt"][0])
            return self.send_json(200, {"ok": True})
        if path == "/_stats":
            with st.lock:
                return self.send_json(200, {"bytes": dict(st.bytes), "requests": list(st.requests)})
        if path.startswith("/_lfs/") and len(parts) == 2:
            p = st.by_sha(parts[1])
            return self.send_file(p) if p else self.error(404, "Entry not found")
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "tree":
            return self.tree(parts[2], parts[3], "recursive" in q and q["recursive"][0] == "true")
        if len(parts) >= 5 and parts[2] == "resolve":
            return self.resolve(parts[0], parts[1], "/".join(parts[4:]))
        if parts[:1] == ["v2"] and len(parts) == 5 and parts[3] == "manifests":
            return self.manifest(parts[1], parts[2], parts[4])
        if parts[:1] == ["v2"] and len(parts) == 5 and parts[3] == "blobs":
            sha = parts[4].removeprefix("sha256:")
            if st.by_sha(sha) is None:
                return self.send_json(404, {"errors": [{"code": "BLOB_UNKNOWN"}]})
            return self.redirect(307, f"{self.cdn}/_lfs/{sha}")
        self.error(404, "not found")

    def repo_dir(self, org, repo):
        """The repository's folder, or None after answering 401/404 as the hub does."""
        if org == "private" and self.headers.get("Authorization") != f"Bearer {self.state.token}":
            self.error(401, "Invalid credentials in Authorization header")
            return None
        d = os.path.join(self.state.root, "hf", org, repo)
        if not os.path.isdir(d):
            self.error(404, "Repository not found")
            return None
        return d

    def tree(self, org, repo, recursive):
        d = self.repo_dir(org, repo)
        if d is None:
            return
        out = []
        for dirpath, dirs, files in os.walk(d):
            rel = os.path.relpath(dirpath, d)
            rel = "" if rel == "." else rel + "/"
            for sub in sorted(dirs):
                out.append({"type": "directory", "oid": COMMIT, "size": 0, "path": rel + sub})
            for f in sorted(files):
                p = os.path.join(dirpath, f)
                e = {"type": "file", "oid": git_blob_sha1(p), "size": os.path.getsize(p), "path": rel + f}
                if f.endswith(".gguf"):
                    e["lfs"] = {"oid": self.state.sha256(p), "size": e["size"], "pointerSize": 134}
                out.append(e)
            if not recursive:
                break
        self.send_json(200, out)

    def resolve(self, org, repo, rel):
        d = self.repo_dir(org, repo)
        if d is None:
            return
        p = os.path.join(d, rel)
        if not os.path.isfile(p):
            return self.error(404, "Entry not found")
        sha = self.state.sha256(p)
        if p.endswith(".gguf"):
            return self.redirect(
                302,
                f"{self.cdn}/_lfs/{sha}",
                [
                    ("X-Linked-Etag", f'"{sha}"'),
                    ("X-Linked-Size", str(os.path.getsize(p))),
                    ("X-Repo-Commit", COMMIT),
                    ("ETag", f'"{sha}"'),
                ],
            )
        self.send_file(p, [("ETag", f'"{git_blob_sha1(p)}"'), ("X-Repo-Commit", COMMIT)])

    def manifest(self, ns, name, tag):
        p = os.path.join(self.state.root, "ollama", ns, name, tag + ".gguf")
        if not os.path.isfile(p):
            return self.send_json(404, {"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]})
        params = b'{"stop":["<|im_end|>"]}'
        self.send_json(
            200,
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:" + "0" * 64, "size": 2},
                "layers": [
                    {"mediaType": MODEL_LAYER, "digest": "sha256:" + self.state.sha256(p), "size": os.path.getsize(p)},
                    {"mediaType": "application/vnd.ollama.image.params", "digest": "sha256:" + hashlib.sha256(params).hexdigest(), "size": len(params)},
                ],
            },
            [("Content-Type", "application/vnd.docker.distribution.manifest.v2+json")],
        )

    def send_file(self, p, headers=()):
        st = self.state
        base = os.path.basename(p)
        size = os.path.getsize(p)
        start, end, partial = 0, size - 1, False
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[len("bytes="):].partition("-")
            start = int(a) if a else 0
            end = min(int(b), size - 1) if b else size - 1
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            partial = True
        self.send_response(206 if partial else 200)
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        if partial:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            return
        with open(p, "rb") as f:
            f.seek(start)
            data = bytearray(f.read(end - start + 1))
        with st.lock:
            if base in st.corrupt:
                mid = size // 2
                if start <= mid <= end:
                    data[mid - start] ^= 0xFF
            cut, delay = st.cuts.get(base, (None, 0))
            if cut is not None and start <= cut <= end:
                del st.cuts[base]
                data = data[: cut - start]
            else:
                cut = None
        sent = 0
        try:
            for i in range(0, len(data), 64 << 10):
                block = bytes(data[i : i + (64 << 10)])
                self.wfile.write(block)
                sent += len(block)
            self.wfile.flush()
        finally:
            with st.lock:
                st.bytes[base] = st.bytes.get(base, 0) + sent
        if cut is not None:
            # the connection drops mid-body, as a network failure would (after the delay, the
            # client's other connections have finished their chunks)
            time.sleep(delay)
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--token", default="secret-token")
    a = ap.parse_args()
    Handler.state = State(os.path.abspath(a.root), a.token)
    srv = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    srv.daemon_threads = True
    cdn = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    cdn.daemon_threads = True
    Handler.cdn = f"http://127.0.0.1:{cdn.server_address[1]}"
    threading.Thread(target=cdn.serve_forever, daemon=True).start()
    print(f"PORT {srv.server_address[1]}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
