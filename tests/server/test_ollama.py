"""The unmodified official `ollama` client against `quarrel serve`."""
import math
import unittest

import ollama

from common import BASE, MODEL, raw


class OllamaClient(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = ollama.Client(host=BASE)

    def test_list_show_ps_version(self):
        names = [m.model for m in self.c.list().models]
        self.assertIn("smollm2-135m-instruct:latest", names)
        s = self.c.show(MODEL)
        self.assertEqual(s.details.format, "gguf")
        self.assertEqual(s.details.quantization_level, "Q4_1")
        self.assertEqual(s.modelinfo["general.architecture"], "llama")
        self.assertIn("smollm2-135m-instruct:latest", [m.model for m in self.c.ps().models])
        _, _, v = raw("GET", "/api/version")
        self.assertTrue(v["version"])

    def test_generate(self):
        r = self.c.generate(model=MODEL, prompt="Why is the sky blue?", options={"num_predict": 10, "temperature": 0})
        self.assertTrue(r.done)
        self.assertTrue(r.response.strip())
        self.assertEqual(r.eval_count, 10)
        self.assertEqual(r.done_reason, "length")
        parts = list(self.c.generate(model=MODEL, prompt="Why is the sky blue?", options={"num_predict": 10, "temperature": 0}, stream=True))
        self.assertTrue(parts[-1].done)
        self.assertEqual("".join(p.response for p in parts), r.response)

    def test_generate_flat_fields(self):
        # Quarrel's flat fields beside ollama's options
        st, _, a = raw("POST", "/api/generate", {"model": MODEL, "prompt": "Count: 1 2 3", "stream": False, "max_tokens": 5, "temperature": 0, "topk": 1, "topp": 1.0})
        self.assertEqual(st, 200, a)
        self.assertEqual(a["eval_count"], 5)
        b = self.c.generate(model=MODEL, prompt="Count: 1 2 3", options={"num_predict": 5, "temperature": 0})
        self.assertEqual(a["response"], b.response)

    def test_chat(self):
        msgs = [{"role": "user", "content": "Say hello."}]
        r = self.c.chat(model=MODEL, messages=msgs, options={"num_predict": 8, "temperature": 0})
        self.assertEqual(r.message.role, "assistant")
        self.assertTrue(r.message.content)
        parts = list(self.c.chat(model=MODEL + ":latest", messages=msgs, options={"num_predict": 8, "temperature": 0}, stream=True))
        self.assertTrue(parts[-1].done)
        self.assertEqual("".join(p.message.content for p in parts), r.message.content)

    def test_embed(self):
        r = self.c.embed(model=MODEL, input=["hello world", "goodbye"])
        self.assertEqual(len(r.embeddings), 2)
        for e in r.embeddings:
            self.assertAlmostEqual(math.sqrt(sum(x * x for x in e)), 1.0, places=3)

    def test_unknown_model(self):
        with self.assertRaises(ollama.ResponseError) as e:
            self.c.generate(model="no-such-model:7b", prompt="x")
        self.assertEqual(e.exception.status_code, 404)


if __name__ == "__main__":
    unittest.main()
