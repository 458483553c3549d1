"""The monitoring in deploy/ matches the server: every metric (and every fixed label value)
that the Grafana dashboard and the Prometheus rules query is exported by a running server's
/metrics, and the request histograms count what a request did."""
import json
import os
import re
import unittest

from common import BASE, MODEL, metrics, raw

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "deploy")
DASHBOARD = os.path.join(ROOT, "grafana", "dashboards", "quarrel.json")
RULES = os.path.join(ROOT, "prometheus", "rules", "quarrel.yml")
# Series a model without routed experts never has (the served test model is dense): the
# names must still be Quarrel's (crates/server/src/metrics.rs registers them).
MOE_ONLY = {"quarrel_expert_selections", "quarrel_expert_utilization"}
SELECTOR = re.compile(r"\b(quarrel_[a-z0-9_]+)(\{[^}]*\})?")
LABEL_EQ = re.compile(r'([a-z_]+)="([^"$]*)"')


def queries():
    """Every PromQL expression of the dashboard and the rules."""
    exprs = []
    with open(DASHBOARD) as f:
        dash = json.load(f)
    stack = [dash]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            if isinstance(x.get("expr"), str):
                exprs.append(x["expr"])
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, str) and x.startswith("label_values("):
            exprs.append(x)
    with open(RULES) as f:
        text = f.read()
    # `expr:` values, inline or as `|` blocks
    for m in re.finditer(r"expr: *(\|\n((?: {10,}.*\n)+)|.*)", text):
        exprs.append(m.group(2) or m.group(1))
    return exprs


def selectors():
    """(metric, {label: value}) for each selector, fixed-value equality matchers only."""
    out = set()
    for e in queries():
        for m in SELECTOR.finditer(e):
            labels = tuple(sorted(LABEL_EQ.findall(m.group(2) or "")))
            # a histogram's series are queried by their _bucket / _count / _sum names
            out.add((re.sub(r"_(bucket|count|sum)$", "", m.group(1)), labels))
    return out


def exported(name, labels, samples):
    """Whether a sample of `name` (or of the histogram `name`) carries all `labels`."""
    for key in samples:
        metric = key.split("{", 1)[0]
        if metric != name and metric not in (name + "_bucket", name + "_count", name + "_sum"):
            continue
        if all(f'{k}="{v}"' in key for k, v in labels):
            return True
    return False


class DeployMetrics(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # a streamed completion, so the per-request histograms have samples
        status, _, body = raw(
            "POST",
            "/v1/completions",
            {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0},
        )
        assert status == 200, body
        cls.completion_tokens = body["usage"]["completion_tokens"]

    def test_the_files_name_metrics(self):
        names = {n for n, _ in selectors()}
        self.assertGreater(len(names), 15, names)
        for must in ("quarrel_time_to_first_token_seconds", "quarrel_inter_token_latency_seconds",
                     "quarrel_e2e_request_latency_seconds", "quarrel_request_queue_time_seconds",
                     "quarrel_request_prompt_tokens", "quarrel_request_generation_tokens", "quarrel_engine"):
            self.assertIn(must, names)

    def test_every_queried_metric_is_exported(self):
        samples = metrics()
        missing = [
            f"{n}{{{','.join(f'{k}={v!r}' for k, v in labels)}}}"
            for n, labels in sorted(selectors())
            if n not in MOE_ONLY and not exported(n, labels, samples)
        ]
        self.assertEqual(missing, [], f"queried by deploy/ but not exported by {BASE}/metrics")

    def test_request_histograms_count_requests(self):
        before = metrics()
        status, _, body = raw("POST", "/v1/completions", {"model": MODEL, "prompt": "One, two,", "max_tokens": 5, "temperature": 0})
        self.assertEqual(status, 200, body)
        after = metrics()
        n = body["usage"]["completion_tokens"]
        p = body["usage"]["prompt_tokens"]

        def delta(metric):
            # summed over the model label: the server labels by its catalog name, which
            # may differ from the alias the request used
            def total(m):
                return sum(v for k, v in m.items() if k.startswith(metric + "{"))

            return total(after) - total(before)

        for h in ("e2e_request_latency_seconds", "request_queue_time_seconds", "request_prompt_tokens", "request_generation_tokens"):
            self.assertGreaterEqual(delta(f"quarrel_{h}_count"), 1, h)
        self.assertGreaterEqual(delta("quarrel_request_generation_tokens_sum"), n)
        self.assertGreaterEqual(delta("quarrel_request_prompt_tokens_sum"), p)
        self.assertGreater(delta("quarrel_e2e_request_latency_seconds_sum"), 0)

if __name__ == "__main__":
    unittest.main()
