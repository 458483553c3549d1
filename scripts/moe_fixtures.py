#!/usr/bin/env python3
"""llama.cpp's logits on the tiny MoE / hybrid Mamba2 synthetic models (issue 7 fixtures).

Usage: moe_fixtures.py MODEL_DIR OUT_DIR
Reads MODEL_DIR/<preset>.gguf (written by `quarrel synth -p <preset> -q q4_k_m --seed 7`),
evaluates the fixed token sequence with llama-cpp-python (logits_all=True, one prefill) and
writes OUT_DIR/<preset>.json: tokens and the logits of every position (6 significant digits).
Needs llama_cpp on PYTHONPATH and LLAMA_CPP_LIB_PATH pointing at a libllama build.
"""
import json
import sys
import traceback
from pathlib import Path

PRESETS = [
    "tiny-mixtral",
    "tiny-granite",
    "tiny-granitemoe",
    "tiny-granitehybrid",
    "tiny-mamba2",
    "tiny-nemotron-h",
    "tiny-nemotron-h-moe",
]

# Same sequence as crates/engine/tests/moe_hybrid.rs::fixture_tokens: BOS then 15 ids.
TOKENS = [1] + [(i * 97 + 13) % 509 + 3 for i in range(1, 16)]


def main():
    from llama_cpp import Llama

    model_dir, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in PRESETS:
        try:
            llm = Llama(
                model_path=str(model_dir / f"{name}.gguf"),
                logits_all=True,
                n_ctx=64,
                n_batch=64,
                n_ubatch=64,
                n_threads=8,
                verbose=False,
            )
            llm.eval(TOKENS)
            scores = llm.scores[: len(TOKENS)]
            rows = [[float(f"{v:.6g}") for v in row] for row in scores.tolist()]
            doc = {
                "preset": name,
                "model": f"{name}.gguf (quarrel synth -p {name} -q q4_k_m --seed 7)",
                "reference": "llama.cpp 0.3.36 (llama-cpp-python), CPU, logits_all, one prefill",
                "tokens": TOKENS,
                "n_vocab": len(rows[0]),
                "logits": rows,
            }
            (out_dir / f"{name}.json").write_text(json.dumps(doc, separators=(",", ":")))
            argmax = [max(range(len(r)), key=r.__getitem__) for r in rows]
            print(f"{name}: ok, vocab {len(rows[0])}, argmax {argmax}", flush=True)
            del llm
        except Exception:
            failed += 1
            print(f"{name}: FAILED", flush=True)
            traceback.print_exc()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
