"""The unmodified official `openai` client against `quarrel serve`."""
import math
import unittest

import openai

from common import BASE, MODEL, raw


class OpenAIClient(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0)

    def test_models_list(self):
        ids = [m.id for m in self.c.models.list()]
        self.assertIn("smollm2-135m-instruct", ids)
        self.assertEqual(self.c.models.retrieve(MODEL).id, "smollm2-135m-instruct")

    def test_chat(self):
        r = self.c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=16, temperature=0)
        ch = r.choices[0]
        self.assertEqual(ch.message.role, "assistant")
        self.assertTrue(ch.message.content.strip())
        self.assertIn(ch.finish_reason, ("stop", "length"))
        self.assertGreater(r.usage.prompt_tokens, 5)
        self.assertGreater(r.usage.completion_tokens, 0)
        self.assertLessEqual(r.usage.completion_tokens, 16)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)
        # greedy is deterministic
        r2 = self.c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=16, temperature=0)
        self.assertEqual(r2.choices[0].message.content, ch.message.content)

    def test_chat_stream_matches_non_stream(self):
        kw = dict(model=MODEL, messages=[{"role": "user", "content": "Name three colors."}], max_tokens=20, temperature=0)
        whole = self.c.chat.completions.create(**kw).choices[0].message.content
        chunks = list(self.c.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, whole)
        finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        self.assertEqual(len(finals), 1)
        self.assertEqual(chunks[-1].choices, [])
        self.assertGreater(chunks[-1].usage.completion_tokens, 0)

    def test_seed_and_max_tokens(self):
        kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=1.0, top_p=0.9, seed=1234)
        a = self.c.completions.create(**kw)
        b = self.c.completions.create(**kw)
        self.assertEqual(a.choices[0].text, b.choices[0].text)
        self.assertEqual(a.usage.completion_tokens, 12)
        self.assertEqual(a.choices[0].finish_reason, "length")

    def test_stop(self):
        r = self.c.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=30, temperature=0, stop=[" 7"])
        self.assertNotIn(" 7", r.choices[0].text)
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_completion_stream_and_logprobs(self):
        r = self.c.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0, logprobs=3)
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 6)
        self.assertEqual("".join(lp.tokens), r.choices[0].text)
        for tok, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            self.assertLessEqual(l, 0.0)
            self.assertEqual(len(top), 3)
            # greedy: the chosen token is the most likely one
            self.assertAlmostEqual(max(top.values()), l, places=5)
        s = "".join(c.choices[0].text for c in self.c.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0, stream=True))
        self.assertEqual(s, r.choices[0].text)

    def test_logit_bias(self):
        kw = dict(model=MODEL, prompt="The capital of France is", max_tokens=3, temperature=0, logprobs=1)
        first = self.c.completions.create(**kw).choices[0].logprobs.tokens[0]
        status, _, body = raw("POST", "/tokenize", {"content": first})
        self.assertEqual(status, 200, body)
        banned = body["tokens"][0]
        r = self.c.completions.create(logit_bias={str(banned): -100}, **kw)
        self.assertNotEqual(r.choices[0].logprobs.tokens[0], first)
        status, _, body = raw("POST", "/tokenize", {"content": " banana"})
        forced = body["tokens"][0]
        r = self.c.completions.create(logit_bias={str(forced): 100}, **kw)
        status, _, text = raw("POST", "/detokenize", {"tokens": [forced]})
        self.assertEqual(r.choices[0].logprobs.tokens[0], text["content"])
        for bad in [{"x": 1}, {str(banned): 500}, {"999999999": 1}]:
            status, _, err = raw("POST", "/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 1, "logit_bias": bad})
            self.assertEqual(status, 400, (bad, err))

    def test_chat_logprobs(self):
        r = self.c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), r.usage.completion_tokens)
        self.assertTrue(all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content))

    def test_n_choices(self):
        kw = dict(model=MODEL, messages=[{"role": "user", "content": "Tell me a fruit."}], max_tokens=8, temperature=1.0, seed=7)
        r = self.c.chat.completions.create(n=3, **kw)
        self.assertEqual([c.index for c in r.choices], [0, 1, 2])
        self.assertTrue(all(c.message.content for c in r.choices))
        # choice i uses seed + i: choice 0 equals a single request with the same seed
        one = self.c.chat.completions.create(**kw)
        self.assertEqual(one.choices[0].message.content, r.choices[0].message.content)
        # the prompt is counted once, the completions summed
        self.assertEqual(r.usage.prompt_tokens, one.usage.prompt_tokens)
        self.assertGreaterEqual(r.usage.completion_tokens, 3)
        self.assertLessEqual(r.usage.completion_tokens, 24)
        texts = {0: "", 1: "", 2: ""}
        finished = set()
        for ch in self.c.chat.completions.create(n=3, stream=True, **kw):
            for c in ch.choices:
                texts[c.index] += c.delta.content or ""
                if c.finish_reason:
                    finished.add(c.index)
        self.assertEqual(finished, {0, 1, 2})
        self.assertEqual([texts[i] for i in range(3)], [c.message.content for c in r.choices])

    def test_embeddings(self):
        r = self.c.embeddings.create(model=MODEL, input=["hello world", "a cat sat on the mat"])
        self.assertEqual(len(r.data), 2)
        for d in r.data:
            self.assertEqual(len(d.embedding), 576)
            self.assertAlmostEqual(math.sqrt(sum(x * x for x in d.embedding)), 1.0, places=3)
        self.assertNotEqual(r.data[0].embedding, r.data[1].embedding)
        f = self.c.embeddings.create(model=MODEL, input="hello world", encoding_format="float")
        for x, y in zip(f.data[0].embedding, r.data[0].embedding):
            self.assertAlmostEqual(x, y, places=5)
        self.assertGreater(r.usage.prompt_tokens, 2)

    def test_errors_raise_typed_exceptions(self):
        with self.assertRaises(openai.NotFoundError):
            self.c.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
        with self.assertRaises(openai.BadRequestError) as e:
            self.c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], temperature=3)
        self.assertEqual(e.exception.body["code"], "invalid_request")


if __name__ == "__main__":
    unittest.main()
