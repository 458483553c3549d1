"""llama-server's utility routes: /tokenize, /detokenize, /apply-template, /health."""
import unittest

from common import AUTH_BASE, MODEL, raw


class UtilityRoutes(unittest.TestCase):
    def test_tokenize_detokenize_round_trip(self):
        text = "Hello world, structured output!"
        st, _, b = raw("POST", "/tokenize", {"content": text})
        self.assertEqual(st, 200, b)
        ids = b["tokens"]
        self.assertTrue(ids and all(isinstance(i, int) for i in ids))
        st, _, d = raw("POST", "/detokenize", {"tokens": ids, "model": MODEL})
        self.assertEqual(st, 200, d)
        self.assertEqual(d["content"], text)
        st, _, p = raw("POST", "/tokenize", {"content": text, "with_pieces": True})
        self.assertEqual([t["id"] for t in p["tokens"]], ids)
        self.assertEqual("".join(t["piece"] for t in p["tokens"]), text)
        # control-token text is parsed by default, kept as text on request
        st, _, sp = raw("POST", "/tokenize", {"content": "<|im_start|>"})
        st, _, plain = raw("POST", "/tokenize", {"content": "<|im_start|>", "parse_special": False})
        self.assertEqual(len(sp["tokens"]), 1)
        self.assertGreater(len(plain["tokens"]), 1)

    def test_apply_template_renders_the_chat_prompt(self):
        st, _, b = raw("POST", "/apply-template", {"messages": [{"role": "user", "content": "Hi there"}]})
        self.assertEqual(st, 200, b)
        self.assertIn("Hi there", b["prompt"])
        self.assertTrue(b["prompt"].rstrip().endswith("assistant"), b["prompt"])

    def test_bad_input_and_health(self):
        self.assertEqual(raw("POST", "/detokenize", {"tokens": [10**9]})[0], 400)
        self.assertEqual(raw("POST", "/detokenize", {"tokens": "x"})[0], 400)
        self.assertEqual(raw("POST", "/apply-template", {"messages": []})[0], 400)
        self.assertEqual(raw("POST", "/tokenize", {"content": "x"}, headers={"Content-Type": "text/plain"})[0], 415)
        st, _, h = raw("GET", "/health")
        self.assertEqual((st, h["status"]), (200, "ok"))

    @unittest.skipUnless(AUTH_BASE, "needs the server with keys")
    def test_utility_routes_need_a_key(self):
        self.assertEqual(raw("POST", "/tokenize", {"content": "x"}, base=AUTH_BASE)[0], 401)
        self.assertEqual(raw("GET", "/health", base=AUTH_BASE)[0], 200)


if __name__ == "__main__":
    unittest.main()
