#!/usr/bin/env python3
"""Compile the CUDA backend's kernels without a GPU: each unit of `UNITS` in
crates/backend-cuda/src/kernels.rs as the backend does at run time (NVRTC), in parallel, then ptxas
for sm_90, and print errors and spills (registers per kernel with --verbose). Catches compile errors before device time is spent.

    python3 -m pip download --no-deps -d /tmp/nvw "nvidia-cuda-nvrtc==13.0.*" "nvidia-cuda-nvcc==13.0.*"
    mkdir -p /tmp/nv && (cd /tmp/nv && for f in /tmp/nvw/*.whl; do unzip -qo $f; done)
    LD_LIBRARY_PATH=/tmp/nv/nvidia/cu13/lib python3 scripts/cuda-kernel-check.py [--nv /tmp/nv/nvidia/cu13] [--arch 90]
"""
import argparse, concurrent.futures, ctypes, os, re, subprocess, sys, tempfile, time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser()
ap.add_argument("--nv", default="/tmp/nv/nvidia/cu13")
ap.add_argument("--arch", default="90")
ap.add_argument("--jobs", type=int, default=os.cpu_count())
ap.add_argument("--verbose", action="store_true", help="registers of every kernel")
ap.add_argument("--only", default=None, help="comma-separated unit names (default: every unit)")
ap.add_argument("--keep", default=None, help="directory for each unit's CUBIN and, where cuobjdump is found (--cuobjdump), its SASS")
ap.add_argument("--ptx", default=None, help="directory for each kernel's PTX (DIR/<unit>/<kernel>.ptx: compare two checkouts with diff -r)")
ap.add_argument("--cuobjdump", default="cuobjdump", help="cuobjdump binary (pip: nvidia-cuda-cuobjdump)")
a = ap.parse_args()
nv_rs = open(os.path.join(root, "crates/backend-cuda/src/kernels.rs")).read()
units = [(n, re.findall(r'"([\w.]+)"', f), d.encode().decode("unicode_escape"))
         for n, f, d in re.findall(r'Unit\s*\{\s*name:\s*"(\w+)",\s*files:\s*&\[([^\]]*)\],\s*defines:\s*"([^"]*)",?\s*\}', nv_rs)]
assert units, "no units parsed from src/kernels.rs"
if a.only:
    units = [u for u in units if u[0] in a.only.split(",")]
lib = ctypes.CDLL(os.path.join(a.nv, "lib/libnvrtc.so.13"))


def check(unit):
    """NVRTC (PTX for compute_XY) then ptxas for sm_XY: (name, ok, report lines)."""
    name, files, defines = unit
    src = defines + "".join(f"// ---- {n}\n{open(os.path.join(root, 'crates/backend-cuda/kernels', n)).read()}\n" for n in ["common.cuh"] + files)
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), f"{name}.cu".encode(), 0, None, None) == 0
    opts = [f"--gpu-architecture=compute_{a.arch}".encode(), b"--std=c++17"]
    t0 = time.time()
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    out = [f"NVRTC unit {name} ({', '.join(files)}): rc {rc} in {time.time() - t0:.1f} s", log.value.decode().strip()]
    if rc != 0:
        return name, False, out
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, ptx)
    if a.ptx:
        os.makedirs(os.path.join(a.ptx, name), exist_ok=True)
        text = ptx.value.decode()
        for m in re.finditer(r"^\.visible \.entry (\w+)\(.*?^}", text, re.S | re.M):
            open(os.path.join(a.ptx, name, f"{m.group(1)}.ptx"), "w").write(m.group(0))
    with tempfile.TemporaryDirectory() as d:
        open(f"{d}/k.ptx", "wb").write(ptx.value)
        r = subprocess.run([os.path.join(a.nv, "bin/ptxas"), f"-arch=sm_{a.arch}", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"], capture_output=True, text=True)
        if a.keep and r.returncode == 0:
            os.makedirs(a.keep, exist_ok=True)
            open(os.path.join(a.keep, f"{name}.cubin"), "wb").write(open(f"{d}/k.cubin", "rb").read())
            try:
                sass = subprocess.run([a.cuobjdump, "-sass", f"{d}/k.cubin"], capture_output=True, text=True).stdout
                open(os.path.join(a.keep, f"{name}.sass"), "w").write(sass)
            except OSError:
                pass
    fn = None
    for line in r.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            fn = m.group(1)
        m = re.search(r"(\d+) bytes spill stores", line)
        if m and int(m.group(1)) > 0:
            out.append(f"{fn}: {line.strip()}")
        m = re.search(r"Used (\d+) registers", line)
        if m and a.verbose:
            out.append(f"{fn}: {m.group(1)} registers")
        if "error" in line.lower():
            out.append(line)
    out.append(f"ptxas unit {name} sm_{a.arch}: rc {r.returncode}")
    return name, r.returncode == 0, out


with concurrent.futures.ThreadPoolExecutor(a.jobs) as ex:
    results = list(ex.map(check, units))
for name, ok, out in results:
    print("\n".join(l for l in out if l))
bad = [n for n, ok, _ in results if not ok]
print(f"{len(units) - len(bad)}/{len(units)} units compiled" + (f"; FAILED: {', '.join(bad)}" if bad else ""))
sys.exit(1 if bad else 0)
