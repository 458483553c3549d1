"""API keys (created and revoked with `quarrel keys`), per-key rate limits with Retry-After,
and CORS, against a second server started with --keys, --rate-limit and --cors-origin."""
import json
import subprocess
import time
import unittest

import openai

from common import AUTH_BASE, KEYS_FILE, MODEL, QUARREL_BIN, raw


def keys(*args):
    out = subprocess.run([QUARREL_BIN, "keys", "--keys", KEYS_FILE, *args], check=True, capture_output=True, text=True)
    return out.stdout


@unittest.skipUnless(AUTH_BASE, "QUARREL_AUTH_URL not set")
class Auth(unittest.TestCase):
    def get(self, path="/v1/models", **headers):
        return raw("GET", path, headers=headers, base=AUTH_BASE)

    def test_no_wrong_revoked_key_is_401(self):
        k = json.loads(keys("create", "t1", "--json"))
        self.assertNotIn(k["key"], open(KEYS_FILE).read())
        self.assertIn(k["id"], keys("list"))
        self.assertEqual(self.get()[0], 401)
        st, _, b = self.get(Authorization="Bearer qk-wrong")
        self.assertEqual((st, b["error"]["code"]), (401, "unauthorized"))
        self.assertEqual(self.get(Authorization="Bearer " + k["key"])[0], 200)
        self.assertEqual(self.get(**{"x-api-key": k["key"]})[0], 200)
        # public probes need no key
        self.assertEqual(self.get("/healthz")[0], 200)
        keys("revoke", k["id"])
        time.sleep(1.1)
        st, _, b = self.get(Authorization="Bearer " + k["key"])
        self.assertEqual(st, 401)
        self.assertIn("revoked", b["error"]["message"])

    def test_openai_client_with_key(self):
        k = json.loads(keys("create", "t2", "--json"))
        c = openai.OpenAI(base_url=AUTH_BASE + "/v1", api_key=k["key"], max_retries=0)
        r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0)
        self.assertTrue(r.choices[0].message.content)
        bad = openai.OpenAI(base_url=AUTH_BASE + "/v1", api_key="qk-nope", max_retries=0)
        with self.assertRaises(openai.AuthenticationError):
            bad.models.list()

    def test_rate_limit_429_with_retry_after(self):
        k = json.loads(keys("create", "t3", "--json"))
        h = {"Authorization": "Bearer " + k["key"]}
        statuses = []
        for _ in range(12):
            st, hdrs, b = raw("GET", "/v1/models", headers=h, base=AUTH_BASE)
            statuses.append(st)
            if st == 429:
                self.assertGreaterEqual(int(hdrs["retry-after"]), 1)
                self.assertEqual(b["error"]["code"], "rate_limit_exceeded")
                break
        self.assertEqual(statuses[-1], 429, statuses)
        self.assertTrue(all(s == 200 for s in statuses[:-1]))

    def test_cors(self):
        st, hdrs, _ = raw("OPTIONS", "/v1/models", headers={"Origin": "http://example.test", "Access-Control-Request-Method": "POST",
                                                         "Access-Control-Request-Headers": "authorization"}, base=AUTH_BASE)
        self.assertEqual(st, 200)
        self.assertEqual(hdrs.get("access-control-allow-origin"), "http://example.test")
        st, hdrs, _ = raw("OPTIONS", "/v1/models", headers={"Origin": "http://evil.test", "Access-Control-Request-Method": "POST"}, base=AUTH_BASE)
        self.assertNotIn("access-control-allow-origin", {k.lower() for k in hdrs})

    def test_websocket_requires_key(self):
        import asyncio
        import websockets

        async def go():
            async with websockets.connect(AUTH_BASE.replace("http", "ws", 1) + "/ws") as ws:
                m = json.loads(await asyncio.wait_for(ws.recv(), 30))
                try:
                    await asyncio.wait_for(ws.recv(), 30)
                except websockets.ConnectionClosed as e:
                    return m, e.rcvd.code
        m, code = asyncio.run(go())
        self.assertEqual(m["payload"]["code"], "UNAUTHORIZED")
        self.assertEqual(code, 1008)


if __name__ == "__main__":
    unittest.main()
