#!/usr/bin/env python3
"""GEMV microbenchmark of the CUDA backend's decode kernels (a GPU machine with CuPy).

Compiles crates/backend-cuda/kernels/{common.cuh,matmul.cu} with NVRTC (through CuPy) once per
variant (-D GEMV_ROWS / GEMV_UNROLL), launches `gemv_<type>_1` on 7B / 1B decode shapes with
random weights (several copies rotated so that the L2 cache holds none of them), replays the
launches as a CUDA graph, and prints microseconds per GEMV and achieved bandwidth (weight bytes
per second) next to a device-to-device copy (bytes read + written per second) of the same run.
A benchmark: it checks no numerics (crates/backend-cuda/tests/ops.rs does).

    python3 scripts/gemv-bench.py [--variants 2x2,4x2] [--out file]
"""
import argparse, os, sys, time
import numpy as np
import cupy as cp

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
kdir = os.path.join(root, "crates/backend-cuda/kernels")
ap = argparse.ArgumentParser()
ap.add_argument("--variants", default="2x2,1x2,4x2,2x4,4x4,1x4")
ap.add_argument("--types", default="q4_0,q8_0,q4_K,q6_K")
ap.add_argument("--reps", type=int, default=40)
ap.add_argument("--out", default=None)
a = ap.parse_args()
out = open(a.out, "w") if a.out else None


def say(s):
    print(s, flush=True)
    if out:
        out.write(s + "\n")
        out.flush()


src = "".join(f"// ---- {n}\n{open(os.path.join(kdir, n)).read()}\n" for n in ["common.cuh", "matmul.cu"])
# bytes of the payload plane / meta plane per unit of 32 values (src/weight.rs)
LAYOUT = {"q4_0": (16, 2), "q4_1": (16, 4), "q8_0": (32, 2), "q4_K": (18, 0), "q5_K": (22, 0), "q6_K": (28, 0)}
SHAPES = [(4096, 4096), (4096, 6144), (4096, 14336), (4096, 28672), (14336, 4096), (4096, 32000), (2048, 2048), (2048, 2560), (2048, 11264), (5632, 2048), (2048, 32000)]


def copy_bw():
    n = 1 << 30
    x = cp.random.randint(0, 255, n, dtype=cp.uint8)
    y = cp.empty_like(x)
    cp.copyto(y, x)
    s, e = cp.cuda.Event(), cp.cuda.Event()
    s.record()
    for _ in range(10):
        cp.copyto(y, x)
    e.record()
    e.synchronize()
    return 2 * n * 10 / (cp.cuda.get_elapsed_time(s, e) * 1e-3) / 1e9


def wpr_policy(n_out, rows, units):
    """src/matmul.rs gemv_shape (quantized rows of `units` units)."""
    if units >= 64:
        return 4 if units >= 128 and n_out < 2400 else 2
    b1 = -(-n_out // (4 * rows))
    return 1 if b1 >= 1024 else (2 if b1 >= 512 else 4)


def main():
    dev = cp.cuda.Device()
    say(f"device: {cp.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}, copy {copy_bw():.0f} GB/s (read+write)")
    mods = {}
    for v in a.variants.split(","):
        rows, unroll = (int(x) for x in v.split("x"))
        t = time.time()
        mods[v] = cp.RawModule(code=src, options=("--std=c++17", f"-DGEMV_ROWS={rows}", f"-DGEMV_UNROLL={unroll}"))
        mods[v].get_function("gemv_q4_0_1")
        say(f"variant rows {rows} unroll {unroll}: compiled in {time.time() - t:.1f} s")
    stream = cp.cuda.Stream(non_blocking=True)
    say("| type | n_in | n_out | MB | variant | wpr | us | GB/s |")
    say("|---|---:|---:|---:|---|---:|---:|---:|")
    best = []
    for ty in a.types.split(","):
        pb, mb = LAYOUT[ty]
        for n_in, n_out in SHAPES:
            U = n_in // 32
            wbytes = n_out * U * (pb + mb)
            copies = max(2, -(-(400 << 20) // wbytes))
            Ps = [cp.random.randint(0, 255, n_out * U * pb, dtype=cp.uint8) for _ in range(copies)]
            # f16 scales of moderate size (0x2000..0x27ff), never NaN
            Ms = [(cp.random.randint(0x2000, 0x2800, n_out * U * max(mb, 2) // 2, dtype=cp.uint16)).view(cp.uint8) for _ in range(copies)]
            xq = cp.random.randint(-127, 128, n_in, dtype=cp.int8)
            xm = cp.random.uniform(0.01, 0.02, 2 * U, dtype=cp.float32)
            o = cp.empty(n_out, dtype=cp.float32)
            rows_res = []
            for v, mod in mods.items():
                rows = int(v.split("x")[0])
                f = mod.get_function(f"gemv_{ty}_1")
                for wpr in (1, 2, 4):
                    grid = -(-n_out // (rows * 4 // wpr))
                    args = lambda i: (Ps[i % copies], Ms[i % copies], xq, xm, o, np.int32(U), np.int32(n_out), np.int32(wpr))
                    with stream:
                        for i in range(3):
                            f((grid,), (128,), args(i))
                        stream.begin_capture()
                        for i in range(a.reps):
                            f((grid,), (128,), args(i))
                        g = stream.end_capture()
                        g.launch(stream)
                        s, e = cp.cuda.Event(), cp.cuda.Event()
                        s.record(stream)
                        g.launch(stream)
                        e.record(stream)
                        e.synchronize()
                    us = cp.cuda.get_elapsed_time(s, e) * 1e3 / a.reps
                    tag = "*" if wpr == wpr_policy(n_out, rows, U) else ""
                    rows_res.append((us, v, wpr))
                    say(f"| {ty} | {n_in} | {n_out} | {wbytes / 1e6:.1f} | {v} | {wpr}{tag} | {us:.2f} | {wbytes / us / 1e3:.0f} |")
            base = [r for r in rows_res if r[1] == "2x2" and r[2] == wpr_policy(n_out, 2, U)]
            b = min(rows_res)
            best.append((ty, n_in, n_out, wbytes, base[0][0] if base else float("nan"), b))
            del Ps, Ms
            cp.get_default_memory_pool().free_all_blocks()
    say("\nsummary: current kernel (2x2, the wpr policy of src/matmul.rs) vs the best variant")
    say("| type | n_in | n_out | current us | GB/s | best us | GB/s | variant | wpr |")
    say("|---|---:|---:|---:|---:|---:|---:|---|---:|")
    for ty, n_in, n_out, wb, bu, (u, v, w) in best:
        say(f"| {ty} | {n_in} | {n_out} | {bu:.2f} | {wb / bu / 1e3:.0f} | {u:.2f} | {wb / u / 1e3:.0f} | {v} | {w} |")


main()
