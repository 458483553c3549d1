"""An embeddings request is scheduled work: it shares the engine with chat traffic unit by
unit, shows in /api/health and /metrics while it runs, and ends when its client goes away."""
import json
import socket
import time
import unittest
from urllib.parse import urlparse

from common import BASE, MODEL, engine_counter, raw, wait_idle


def health_embeddings():
    _, _, h = raw("GET", "/api/health")
    return sum(m.get("embeddings", 0) for m in h["models"])


def open_embedding_request(n_inputs, words):
    """Send a large /v1/embeddings request on a raw socket and return the socket unread."""
    text = " ".join(f"word{i % 97} and more" for i in range(words))
    body = json.dumps({"model": MODEL, "input": [f"{i}: {text}" for i in range(n_inputs)]}).encode()
    u = urlparse(BASE)
    s = socket.create_connection((u.hostname, u.port), timeout=30)
    head = (f"POST /v1/embeddings HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    s.sendall(head + body)
    return s


class EmbeddingSharing(unittest.TestCase):
    def wait_for(self, cond, timeout, what):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if cond():
                return time.time() - t0
            time.sleep(0.05)
        self.fail(f"timed out waiting for {what}")

    def test_chat_runs_beside_a_large_embedding_request_and_disconnect_cancels_it(self):
        wait_idle()
        finished0 = engine_counter("embed_requests_finished")
        # about 100 inputs of ~300 tokens: minutes of work for this engine alone
        s = open_embedding_request(100, 100)
        try:
            self.wait_for(lambda: health_embeddings() == 1, 30, "the embedding job to show in /api/health")
            t0 = time.time()
            st, _, r = raw("POST", "/v1/completions", {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "temperature": 0})
            took = time.time() - t0
            self.assertEqual(st, 200, r)
            self.assertEqual(r["usage"]["completion_tokens"], 4)
            # the completion did not wait for the embeddings: they are still running
            self.assertEqual(health_embeddings(), 1, f"completion took {took:.1f}s")
            self.assertLess(took, 20)
        finally:
            s.close()
        # the client went away: the job ends within a unit, its memory is freed
        self.wait_for(lambda: health_embeddings() == 0, 30, "the cancelled embedding job to end")
        self.assertEqual(engine_counter("embed_requests_finished"), finished0 + 1)
        wait_idle()
        st, _, r = raw("POST", "/v1/embeddings", {"model": MODEL, "input": ["still serving"]})
        self.assertEqual(st, 200, r)


if __name__ == "__main__":
    unittest.main()
