"""Tokenizing big prompts runs off the async threads: while dozens of prompts of about a
megabyte are tokenized (and then refused as longer than the context), the server keeps
answering other requests at once."""
import threading
import time
import unittest
import urllib.request

from common import BASE, MODEL, raw


class TokenizeOffload(unittest.TestCase):
    def test_health_answers_while_big_prompts_are_tokenized(self):
        prompt = "many words in a very long prompt " * 30000  # ~1 MB, under --max-prompt
        results = []

        def send():
            results.append(raw("POST", "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1})[0])

        threads = [threading.Thread(target=send) for _ in range(32)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        worst = 0.0
        for _ in range(10):
            t0 = time.time()
            with urllib.request.urlopen(BASE + "/healthz", timeout=30) as r:
                self.assertEqual(r.status, 200)
            worst = max(worst, time.time() - t0)
            time.sleep(0.05)
        for t in threads:
            t.join()
        # every big prompt got its answer: longer than the context
        self.assertEqual(results, [400] * 32)
        self.assertLess(worst, 0.5, f"/healthz took {worst:.2f}s while prompts were tokenized")


if __name__ == "__main__":
    unittest.main()
