"""Bad input answered with 4xx JSON errors while the server keeps serving; disconnects free
KV pages within an engine step; metrics, probes, OpenAPI, model load/unload."""
import http.client
import json
import threading
import time
import unittest
import urllib.parse

from common import BASE, MODEL, engine_counter, engine_gauge, metrics, raw, wait_gauges_zero, wait_idle

CHAT = "/v1/chat/completions"


def chat(content="hi", **kw):
    return dict({"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4}, **kw)


class BadInput(unittest.TestCase):
    def check(self, status, method, path, body, headers=None, code=None):
        st, hdrs, b = raw(method, path, body, headers)
        self.assertEqual(st, status, b)
        self.assertIsInstance(b, dict, b)
        self.assertEqual(set(b["error"]), {"code", "message", "type"})
        if code:
            self.assertEqual(b["error"]["code"], code)
        return b

    def test_each_bad_input_is_a_4xx_json_error(self):
        long_prompt = "hello " * 6000
        cases = [
            ("malformed JSON", 400, "POST", CHAT, b'{"model": "x", "messages": [', None),
            ("wrong field types", 400, "POST", CHAT, {"model": MODEL, "messages": "hi"}, None),
            ("wrong field types 2", 400, "POST", CHAT, chat(max_tokens="ten"), None),
            ("unknown model", 404, "POST", CHAT, chat(model="no-such-model"), "model_not_found"),
            ("empty prompt", 400, "POST", "/v1/completions", {"model": MODEL, "prompt": ""}, None),
            ("empty messages", 400, "POST", CHAT, {"model": MODEL, "messages": []}, None),
            ("prompt longer than the context", 400, "POST", "/v1/completions", {"model": MODEL, "prompt": long_prompt}, "context_length_exceeded"),
            ("max_tokens < 0", 400, "POST", CHAT, chat(max_tokens=-5), None),
            ("temperature out of range", 400, "POST", CHAT, chat(temperature=2.5), None),
            ("negative temperature", 400, "POST", "/api/generate", {"model": MODEL, "prompt": "x", "options": {"temperature": -1}}, None),
            ("top_p out of range", 400, "POST", CHAT, chat(top_p=1.5), None),
            ("invalid UTF-8", 400, "POST", "/v1/completions", b'{"model": "smollm2", "prompt": "\xff\xfe"}', None),
            ("oversized body", 413, "POST", CHAT, b'{"x": "' + b"a" * (5 << 20) + b'"}', None),
            ("unknown route", 404, "GET", "/v2/nothing", None, "not_found"),
            ("wrong method", 405, "GET", CHAT, None, None),
            ("ollama unknown model", 404, "POST", "/api/chat", {"model": "nope:1b", "messages": [{"role": "user", "content": "x"}]}, None),
            ("ollama empty prompt", 400, "POST", "/api/generate", {"model": MODEL, "prompt": ""}, None),
            ("embedding of nothing", 400, "POST", "/v1/embeddings", {"model": MODEL, "input": []}, None),
            ("unknown response_format", 400, "POST", CHAT, chat(response_format={"type": "yaml"}), None),
            ("bad JSON schema", 400, "POST", CHAT, chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}), None),
            ("bad GBNF grammar", 400, "POST", CHAT, chat(grammar="root ::= missing"), None),
            ("ollama unknown format", 400, "POST", "/api/generate", {"model": MODEL, "prompt": "x", "format": "xml"}, None),
            ("n out of range", 400, "POST", CHAT, chat(n=50), None),
            ("quarrel stream without prompt", 400, "POST", "/api/stream", {"model": MODEL}, None),
        ]
        for name, status, method, path, body, code in cases:
            with self.subTest(name):
                self.check(status, method, path, body, code=code)
        # the server still serves
        st, _, b = raw("POST", CHAT, chat())
        self.assertEqual(st, 200, b)

    def test_bad_input_while_others_stream(self):
        results = []

        def stream():
            st, _, b = raw("POST", "/api/stream", {"model": MODEL, "prompt": "Tell a story", "max_tokens": 40})
            results.append((st, b))
        t = threading.Thread(target=stream)
        t.start()
        for _ in range(20):
            self.check(400, "POST", CHAT, b"{nope")
        t.join()
        st, text = results[0]
        self.assertEqual(st, 200)
        self.assertIn("event: done", text)
        self.assertIn('"complete":true', text)


class Disconnect(unittest.TestCase):
    def disconnect(self, stream):
        wait_idle()
        u = urllib.parse.urlparse(BASE)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        # greedy: this prompt runs far past the few tokens we wait for
        body = json.dumps({"model": MODEL, "prompt": "Once upon a time, in a land far away,", "max_tokens": 2000, "temperature": 0, "stream": stream})
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        if stream:
            r = conn.getresponse()
            self.assertEqual(r.status, 200)
            for _ in range(8):
                r.fp.readline()
        else:
            t0 = time.time()
            while engine_counter("generated_tokens") == 0 or engine_gauge("running") == 0:
                self.assertLess(time.time() - t0, 30)
                time.sleep(0.02)
            time.sleep(0.3)
        m = metrics()
        self.assertGreater(engine_gauge("kv_blocks_used", m), 0)
        self.assertEqual(engine_gauge("running", m), 1)
        steps_before = engine_counter("steps", m)
        conn.sock.close()
        conn.close()
        _, m = wait_gauges_zero(("kv_blocks_used", "running"), 10, poll=0.01)
        self.assertEqual(engine_gauge("kv_blocks_used", m), 0)
        self.assertEqual(engine_gauge("running", m), 0)
        # freed at the first step after the disconnect (plus the step in flight and the one
        # that may have started between our reading the counter and closing the socket)
        self.assertLessEqual(engine_counter("steps", m) - steps_before, 3)

    def test_streaming_client_disconnect_frees_kv_within_a_step(self):
        self.disconnect(stream=True)

    def test_waiting_client_disconnect_frees_kv_within_a_step(self):
        self.disconnect(stream=False)


class Observability(unittest.TestCase):
    def test_metrics_probes_openapi_request_id(self):
        raw("POST", CHAT, chat(stream=False))
        m = metrics()
        keys = "\n".join(m)
        for name in ["quarrel_http_requests_total", "quarrel_errors_total", "quarrel_http_requests_active", "quarrel_http_connections_active", "quarrel_ws_connections_active",
                     "quarrel_request_duration_seconds_bucket", "quarrel_time_to_first_token_seconds_bucket",
                     "quarrel_inter_token_latency_seconds_bucket", "quarrel_prompt_tokens_total", "quarrel_generated_tokens_total",
                     "quarrel_models_loaded", 'gauge="queue_depth"', 'gauge="batch_tokens"', 'gauge="kv_blocks_used"']:
            self.assertIn(name, keys)
        self.assertIn('quarrel_http_requests_total{model="smollm2-135m-instruct",route="/v1/chat/completions",status="200"}', m)
        self.assertEqual(raw("GET", "/healthz")[0], 200)
        self.assertEqual(raw("GET", "/readyz")[0], 200)
        self.assertTrue(raw("GET", "/version")[2]["version"])
        st, hdrs, doc = raw("GET", "/openapi.json")
        self.assertEqual(doc["openapi"], "3.1.0")
        for p in ["/v1/chat/completions", "/api/generate", "/api/stream", "/api/models/{name}/load"]:
            self.assertIn(p, doc["paths"])
        st, hdrs, _ = raw("GET", "/healthz", headers={"x-request-id": "test-id-123"})
        self.assertEqual(hdrs.get("x-request-id"), "test-id-123")
        st, hdrs, _ = raw("GET", "/healthz")
        self.assertEqual(len(hdrs.get("x-request-id", "")), 36)
        st, _, h = raw("GET", "/api/health")
        self.assertEqual(h["status"], "ok")
        st, _, j = raw("GET", "/api/metrics")
        self.assertIn("smollm2-135m-instruct", j["models"])

    def test_models_api_and_load_unload(self):
        st, _, ms = raw("GET", "/api/models")
        self.assertEqual(st, 200)
        loaded = [m for m in ms["models"] if m["loaded"]]
        self.assertTrue(loaded)
        st, _, d = raw("GET", "/api/models/" + MODEL)
        self.assertEqual(d["details"]["quantization"], "Q4_1")
        self.assertGreater(d["memory"]["kv_cache_bytes"], 0)
        self.assertGreater(d["details"]["parameters"], 100_000_000)
        self.assertEqual(raw("GET", "/api/models/nope")[0], 404)
        self.assertEqual(raw("POST", "/api/models/nope/load")[0], 404)
        self.assertEqual(raw("DELETE", "/api/models/" + MODEL + "/load")[0], 200)
        self.assertFalse(raw("GET", "/api/models/" + MODEL)[2]["loaded"])
        # loaded again on demand by the next request
        st, _, b = raw("POST", CHAT, chat())
        self.assertEqual(st, 200, b)
        self.assertTrue(raw("GET", "/api/models/" + MODEL)[2]["loaded"])
        self.assertEqual(raw("POST", "/api/models/" + MODEL + "/load")[0], 200)


if __name__ == "__main__":
    unittest.main()
