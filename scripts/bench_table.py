"""What gpu-ab.sh and gpu-bench.sh share for their tables: reading `bench -o json` /
llama-bench JSON results and the Markdown table's head."""
import json

# (n_prompt, n_gen) of each row, and its name
TESTS = [((512, 0), "pp512"), ((0, 128), "tg128")]


def load(path):
    """{(n_prompt, n_gen): result} of a JSON results file; {} when it is missing or unreadable."""
    try:
        return {(r["n_prompt"], r["n_gen"]): r for r in json.load(open(path))}
    except Exception:
        return {}


def print_head(a, b, ratio):
    """A blank line, then the head of a table of model, test, two speeds and their ratio."""
    print()
    print(f"| model | test | {a} | {b} | {ratio} |")
    print("|---|---|---:|---:|---:|")
