"""Starting a `quarrel serve` of one's own for the standalone server tests (chaos.py,
long_context.py, embed_fairness.py): a free loopback port, the log in a file, ready when
/readyz answers."""
import json
import socket
import subprocess
import sys
import time
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start(binary, args, log_path, threads=0, device="", wait_s=300):
    """`binary serve --port P args...` with its output in `log_path`; returns (process, base URL)
    once /readyz answers, exits the test when the server dies or does not become ready."""
    port = free_port()
    cmd = [binary, "serve", "--port", str(port)] + list(args)
    cmd += ["-t", str(threads)] if threads else []
    cmd += ["--device", device] if device else []
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    base = f"http://127.0.0.1:{port}"
    t0 = time.time()
    while time.time() - t0 < wait_s:
        try:
            urllib.request.urlopen(base + "/readyz", timeout=2)
            return proc, base
        except OSError:
            if proc.poll() is not None:
                sys.exit(f"server exited at start: see {log_path}")
            time.sleep(0.5)
    proc.kill()
    sys.exit(f"server not ready after {wait_s} s: see {log_path}")


def default_model(base):
    """The id of the first model a server lists."""
    with urllib.request.urlopen(base + "/v1/models", timeout=10) as r:
        return json.loads(r.read())["data"][0]["id"]
