#!/usr/bin/env python3
"""Generate bit-exact test fixtures for crates/quant (quarrel-quant).

Writes tests/fixtures/quant/<ggml type name>.json for every type in the Rust
type table. Each file holds:

  * table metadata (ggml id, block size, type size) to cross-check the table;
  * "dequantize": random raw blocks (scale fields overwritten with sane /
    edge-case values: normal, f16-subnormal, large, +-0) and the expected f32
    output as little-endian f32 bytes (hex) from gguf-py's numpy
    `gguf.quants.dequantize` (or, for Q8_1/Q8_K which gguf-py lacks, the
    obvious `d * q` computed here in float32 exactly like ggml);
  * "quantize": one f32 input (normal, heavy-tailed, zero, constant, outlier,
    ... blocks) and the expected bytes from every available oracle:
      - gguf-py `gguf.quants.quantize` (F32, F16, BF16, Q4_0, Q4_1, Q5_0,
        Q5_1, Q8_0, MXFP4),
      - optionally ggml's own `quantize_row_*_ref` (and `ggml_quantize_chunk`
        for IQ4_NL's searching variant) called through ctypes from a built
        libggml-base.so (path: $QUARREL_GGML_LIB, default
        /work/dl/llbuild/bin/libggml-base.so). When the library is available
        the script also asserts that gguf-py's dequantization equals ggml's
        `dequantize_row_*` bit for bit.

Encoding: byte strings are lowercase hex; f32 arrays are hex of their
little-endian bytes. Deterministic: each type uses its own seeded RNG.

Usage: python3 scripts/gen_quant_fixtures.py [--require-ggml]
Requires numpy and gguf==0.19.0.
"""
from __future__ import annotations

import ctypes
import json
import os
import sys
import zlib
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "quant"
DEFAULT_LIB = "/work/dl/llbuild/bin/libggml-base.so"

# ggml name, gguf enum, block size, type size (ggml-common.h), f16/f32 scale
# fields as (offset, kind) where kind is "f16" or "f32".
TYPES = [
    ("f32", T.F32, 1, 4, []),
    ("f16", T.F16, 1, 2, []),
    ("bf16", T.BF16, 1, 2, []),
    ("q4_0", T.Q4_0, 32, 18, [(0, "f16")]),
    ("q4_1", T.Q4_1, 32, 20, [(0, "f16"), (2, "f16")]),
    ("q5_0", T.Q5_0, 32, 22, [(0, "f16")]),
    ("q5_1", T.Q5_1, 32, 24, [(0, "f16"), (2, "f16")]),
    ("q8_0", T.Q8_0, 32, 34, [(0, "f16")]),
    ("q8_1", T.Q8_1, 32, 36, [(0, "f16"), (2, "f16")]),
    ("q2_K", T.Q2_K, 256, 84, [(80, "f16"), (82, "f16")]),
    ("q3_K", T.Q3_K, 256, 110, [(108, "f16")]),
    ("q4_K", T.Q4_K, 256, 144, [(0, "f16"), (2, "f16")]),
    ("q5_K", T.Q5_K, 256, 176, [(0, "f16"), (2, "f16")]),
    ("q6_K", T.Q6_K, 256, 210, [(208, "f16")]),
    ("q8_K", T.Q8_K, 256, 292, [(0, "f32")]),
    ("iq4_nl", T.IQ4_NL, 32, 18, [(0, "f16")]),
    ("mxfp4", T.MXFP4, 32, 17, []),
]

# gguf-py 0.19.0 still lists the old 40-byte Q8_1 (f32 d, f32 s); ggml's
# block_q8_1 is 36 bytes (f16 d, f16 s).
GGUF_SIZE_EXCEPTIONS = {"q8_1"}

# types gguf-py can quantize (F32/F16 via astype)
GGUF_QUANTIZE = {"f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "mxfp4"}
# types with a ggml quantize_row_*_ref
GGML_REF_QUANTIZE = {"q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q8_1", "q2_K", "q3_K", "q4_K",
                     "q5_K", "q6_K", "q8_K", "iq4_nl", "mxfp4"}


def hexf32(a: np.ndarray) -> str:
    return np.ascontiguousarray(a, dtype="<f4").tobytes().hex()


def rng_for(name: str) -> np.random.Generator:
    return np.random.default_rng(0x51A7 + zlib.crc32(name.encode()))


# ---------------------------------------------------------------- raw blocks

def scale_values(rng: np.random.Generator, n: int, kind: str) -> list:
    """Per-block scale values cycling through normal / subnormal / large / zero."""
    out = []
    for i in range(n):
        case = i % 4
        sign = -1.0 if rng.random() < 0.3 else 1.0
        if case == 0:
            v = sign * float(rng.uniform(1e-3, 0.1))
        elif case == 1:
            # f16 subnormal range (and a tiny f32 for f32 scales)
            v = sign * float(rng.uniform(1e-7, 6e-5))
        elif case == 2:
            v = sign * float(rng.uniform(10.0, 300.0))
        else:
            v = -0.0 if rng.random() < 0.5 else 0.0
        out.append(v)
    return out


def random_blocks(name: str, bs: int, ts: int, fields, rng) -> tuple[int, np.ndarray]:
    if name in ("f32", "f16", "bf16"):
        n = 256
        if name == "f32":
            v = (rng.standard_normal(n) * np.exp(rng.standard_normal(n) * 3)).astype(np.float32)
            v[:8] = np.array([0.0, -0.0, np.inf, -np.inf, 1e-45, -3e-39, 3.4e38, 1.0], np.float32)
            return n, v.view(np.uint8).copy()
        bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
        if name == "f16":
            nan = ((bits >> 10) & 0x1F) == 0x1F
            nan &= (bits & 0x3FF) != 0
        else:
            nan = ((bits >> 7) & 0xFF) == 0xFF
            nan &= (bits & 0x7F) != 0
        bits[nan] &= 0x3FFF  # clear top exponent bit -> finite
        bits[:4] = [0x0000, 0x8000, 0x0001, 0x8001]
        return n, bits.view(np.uint8).copy()

    nblocks = 4 if bs == 256 else 8
    raw = rng.integers(0, 256, size=(nblocks, ts), dtype=np.uint8)
    for k, (off, kind) in enumerate(fields):
        vals = scale_values(rng, nblocks, kind)
        vals = vals[k:] + vals[:k]  # rotate so d and dmin differ per block
        for b, v in enumerate(vals):
            if kind == "f16":
                raw[b, off:off + 2] = np.array([v], np.float16).view(np.uint8)
            else:
                raw[b, off:off + 4] = np.array([v], np.float32).view(np.uint8)
    if name == "q8_K":
        qs = raw[:, 4:260].view(np.int8).astype(np.int32)
        bsums = qs.reshape(nblocks, 16, 16).sum(axis=-1).astype("<i2")
        raw[:, 260:292] = bsums.view(np.uint8)
    if name == "mxfp4":
        raw[:, 0] = [int(rng.integers(100, 150)), 0, 1, 200, int(rng.integers(110, 140)), 2, 127, 128][:nblocks]
    return nblocks * bs, raw.reshape(-1)


def dequantize_oracle(name: str, qtype: T, raw: np.ndarray, n: int) -> tuple[np.ndarray, str]:
    if name == "q8_1":
        b = raw.reshape(-1, 36)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
        q = b[:, 4:].copy().view(np.int8).astype(np.float32)
        return (q * d).reshape(-1), "numpy d*q (ggml has no dequantize_row_q8_1)"
    if name == "q8_K":
        b = raw.reshape(-1, 292)
        d = b[:, 0:4].copy().view(np.float32)
        q = b[:, 4:260].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(-1), "numpy d*q (= ggml dequantize_row_q8_K)"
    out = gguf.quants.dequantize(raw.copy(), qtype).astype(np.float32, copy=False).reshape(-1)
    assert out.size == n
    return out, "gguf-py 0.19.0 gguf.quants.dequantize"


# ---------------------------------------------------------------- quantize input

def quant_input(name: str, bs: int, rng) -> np.ndarray:
    if name in ("f32", "f16", "bf16"):
        v = (rng.standard_normal(256) * np.exp(rng.standard_normal(256) * 4)).astype(np.float32)
        special = [0.0, -0.0, 65504.0, 65520.0, 70000.0, -1e-8, 6e-8, 1.0 + 2 ** -11,
                   1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, np.inf, -np.inf, 3.3e38, 1e-40]
        v[:len(special)] = np.array(special, np.float32)
        if name == "bf16":
            v[len(special)] = np.float32("nan")
            v[len(special) + 1] = np.uint32(0xFFC12345).view(np.float32)
        return v
    if bs == 32:
        blocks = [
            rng.standard_normal(32),
            rng.standard_normal(32) * np.exp(rng.standard_normal(32)),
            np.zeros(32),
            np.full(32, 0.37),
            np.where(np.arange(32) == 11, 5.0, 0.01 * rng.standard_normal(32)),
            -np.abs(rng.standard_normal(32)),
            rng.uniform(0.0, 1.0, 32),
            1e-6 * rng.standard_normal(32),
        ]
    else:
        half0 = np.concatenate([np.zeros(128), rng.uniform(0.0, 2.0, 128)])
        blocks = [
            rng.standard_normal(256),
            rng.standard_normal(256) * np.exp(rng.standard_normal(256)),
            half0,
            1e-3 * rng.standard_normal(256) + 0.002,
        ]
    return np.concatenate(blocks).astype(np.float32)


# ---------------------------------------------------------------- ggml via ctypes

class Ggml:
    TYPE_IDS = {"iq4_nl": 20}

    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        self.path = path

    def has(self, sym: str) -> bool:
        return hasattr(self.lib, sym)

    def quantize_ref(self, name: str, x: np.ndarray, nbytes: int) -> np.ndarray:
        f = getattr(self.lib, f"quantize_row_{name}_ref")
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        f.restype = None
        x = np.ascontiguousarray(x, np.float32)
        y = np.zeros(nbytes, np.uint8)
        f(x.ctypes.data, y.ctypes.data, x.size)
        return y

    def quantize_chunk(self, type_id: int, x: np.ndarray, nbytes: int, n_per_row: int) -> np.ndarray:
        f = self.lib.ggml_quantize_chunk
        f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                      ctypes.c_int64, ctypes.c_void_p]
        f.restype = ctypes.c_size_t
        x = np.ascontiguousarray(x, np.float32)
        y = np.zeros(nbytes, np.uint8)
        got = f(type_id, x.ctypes.data, y.ctypes.data, 0, x.size // n_per_row, n_per_row, None)
        assert got == nbytes, (got, nbytes)
        return y

    def dequantize(self, name: str, raw: np.ndarray, n: int) -> np.ndarray | None:
        sym = f"dequantize_row_{name}"
        if not self.has(sym):
            return None
        f = getattr(self.lib, sym)
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        f.restype = None
        raw = np.ascontiguousarray(raw, np.uint8)
        y = np.zeros(n, np.float32)
        f(raw.ctypes.data, y.ctypes.data, n)
        return y


def load_ggml(require: bool) -> Ggml | None:
    path = os.environ.get("QUARREL_GGML_LIB", DEFAULT_LIB)
    try:
        return Ggml(path)
    except OSError as e:
        msg = f"ggml library not loadable ({path}): {e}; ggml oracles skipped"
        if require:
            sys.exit(msg)
        print("warning:", msg, file=sys.stderr)
        return None


# ---------------------------------------------------------------- main

def main() -> None:
    require = "--require-ggml" in sys.argv[1:]
    ggml = load_ggml(require)
    OUT.mkdir(parents=True, exist_ok=True)
    total = 0
    for name, qtype, bs, ts, fields in TYPES:
        gbs, gts = GGML_QUANT_SIZES[qtype]
        assert gbs == bs, (name, gbs, bs)
        assert gts == ts or name in GGUF_SIZE_EXCEPTIONS, (name, gts, ts)
        rng = rng_for(name)

        n, raw = random_blocks(name, bs, ts, fields, rng)
        expected, oracle = dequantize_oracle(name, qtype, raw, n)
        if ggml is not None:
            g = ggml.dequantize(name, raw, n)
            if g is not None and not np.array_equal(g.view(np.uint32), expected.view(np.uint32)):
                sys.exit(f"{name}: gguf-py and ggml dequantize disagree")
            if g is not None:
                oracle += "; equal to ggml dequantize_row_" + name

        doc = {
            "type": name,
            "gguf_name": qtype.name,
            "ggml_id": int(qtype),
            "block_size": bs,
            "type_size": ts,
            "gguf_py_type_size": gts,
            "dequantize": {"oracle": oracle, "n": n, "src": raw.tobytes().hex(),
                           "expected_f32": hexf32(expected)},
        }

        x = quant_input(name, bs, rng)
        entries = []
        if name in GGUF_QUANTIZE:
            with np.errstate(over="ignore"):  # f16 overflow to inf is intended
                q = gguf.quants.quantize(x.copy(), qtype)
            qb = np.ascontiguousarray(q).view(np.uint8).reshape(-1)
            entries.append({"oracle": "gguf-py 0.19.0 gguf.quants.quantize", "variant": "ref",
                            "expected": qb.tobytes().hex()})
        if ggml is not None and name in GGML_REF_QUANTIZE:
            nbytes = x.size // bs * ts
            q = ggml.quantize_ref(name, x, nbytes)
            entries.append({"oracle": f"ggml quantize_row_{name}_ref ({os.path.basename(ggml.path)})",
                            "variant": "ref", "expected": q.tobytes().hex()})
            if name == "iq4_nl":
                q = ggml.quantize_chunk(Ggml.TYPE_IDS[name], x, nbytes, x.size)
                entries.append({"oracle": "ggml ggml_quantize_chunk(iq4_nl) = quantize_iq4_nl, ntry=7",
                                "variant": "search", "expected": q.tobytes().hex()})
        # all oracles of the same variant must agree
        refs = {e["expected"] for e in entries if e["variant"] == "ref"}
        if len(refs) > 1:
            sys.exit(f"{name}: quantize oracles disagree")
        doc["quantize"] = {"n": int(x.size), "src_f32": hexf32(x), "expected": entries}

        path = OUT / f"{name}.json"
        text = json.dumps(doc, indent=1) + "\n"
        path.write_text(text)
        total += len(text)
        print(f"{path.relative_to(ROOT)}: {len(text)} bytes, {len(entries)} quantize oracle(s)")
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
