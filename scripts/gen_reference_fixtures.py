#!/usr/bin/env python3
"""Regenerate or extend llama.cpp reference fixtures (tokenize.json, greedy.json).

Uses a llama.cpp build (CPU; see the README's "Reference" section for the cmake flags) with the
exact protocols of the shared fixtures:
  tokenize: llama-tokenize --stdin --ids --no-escape   (BOS per model metadata, specials parsed)
  greedy:   llama-completion --temp 0 -n N --no-display-prompt -no-cnv, raw prompt

Usage:
  scripts/gen_reference_fixtures.py --bin DIR --model M.gguf --out DIR \
      [--texts texts.json] [--prompts prompts.json] [-n 48]
texts.json / prompts.json: JSON lists of strings. CI never runs this; commit its output.
"""
import argparse, json, os, subprocess, sys


def tokenize(bin_dir, model, text):
    out = subprocess.run(
        [os.path.join(bin_dir, "llama-tokenize"), "-m", model, "--stdin", "--ids", "--no-escape", "--log-disable"],
        input=text.encode(), capture_output=True, check=True)
    return json.loads(out.stdout.decode().strip().splitlines()[-1])


def greedy(bin_dir, model, prompt, n):
    out = subprocess.run(
        [os.path.join(bin_dir, "llama-completion"), "-m", model, "-p", prompt, "-n", str(n), "--temp", "0",
         "--no-display-prompt", "-no-cnv", "-t", str(os.cpu_count() or 1)],
        capture_output=True, check=True)
    text = out.stdout.decode("utf-8", errors="replace")
    return text.rstrip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--texts")
    ap.add_argument("--prompts")
    ap.add_argument("-n", type=int, default=48)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    name = os.path.basename(a.model)
    if a.texts:
        cases = [{"text": t, "ids": tokenize(a.bin, a.model, t)} for t in json.load(open(a.texts))]
        json.dump({"model": name, "reference": "llama.cpp llama-tokenize, parse_special=true, add_bos per model",
                   "cases": cases}, open(os.path.join(a.out, "tokenize.json"), "w"), indent=1, ensure_ascii=False)
    if a.prompts:
        cases = []
        for p in json.load(open(a.prompts)):
            c = greedy(a.bin, a.model, p, a.n)
            cases.append({"prompt": p, "n_predict": a.n, "completion": c})
            print(f"{p!r} -> {c[:60]!r}", file=sys.stderr)
        json.dump({"model": name, "reference": "llama.cpp llama-completion --temp 0, raw prompt; compare rstrip()",
                   "cases": cases}, open(os.path.join(a.out, "greedy.json"), "w"), indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
