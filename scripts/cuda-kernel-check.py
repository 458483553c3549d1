#!/usr/bin/env python3
"""Compile the CUDA backend's kernels without a GPU: NVRTC (as the backend does at run time,
same source order as `SOURCES` in crates/backend-cuda/src/device.rs) then ptxas for sm_90, and
print errors, registers and spills per kernel. Catches compile errors before device time is spent.

    python3 -m pip download --no-deps -d /tmp/nvw "nvidia-cuda-nvrtc==13.0.*" "nvidia-cuda-nvcc==13.0.*"
    mkdir -p /tmp/nv && (cd /tmp/nv && for f in /tmp/nvw/*.whl; do unzip -qo $f; done)
    LD_LIBRARY_PATH=/tmp/nv/nvidia/cu13/lib python3 scripts/cuda-kernel-check.py [--nv /tmp/nv/nvidia/cu13] [--arch 90]

--define NAME=VALUE (repeatable) prepends `#define NAME VALUE` as src/device.rs `full_source`
does for its switches (QUARREL_CUDA_NO_PREFETCH -> GEMV_NO_PREFETCH=1, QUARREL_CUDA_GEMV_MINB=n ->
GEMV_MINB=n; give them in that order). --cache DIR writes the backend's kernel cache files for
that source: <fnv>-compute_<arch>.ptx and <fnv>-sm_<arch>.cubin; copied to $QUARREL_HOME/cuda
on a GPU machine of that arch, the backend loads the cubin: no NVRTC, no JIT at start.
"""
import argparse, ctypes, os, re, subprocess, sys, tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser()
ap.add_argument("--nv", default="/tmp/nv/nvidia/cu13")
ap.add_argument("--arch", default="90")
ap.add_argument("--define", action="append", default=[])
ap.add_argument("--cache", default=None)
a = ap.parse_args()
dev_rs = open(os.path.join(root, "crates/backend-cuda/src/device.rs")).read()
names = re.findall(r'\("([\w.]+)", include_str!\("\.\./kernels/', dev_rs)
defs = "".join("#define {} {}\n".format(*d.split("=", 1)) for d in a.define)
src = defs + "".join(f"// ---- {n}\n{open(os.path.join(root, 'crates/backend-cuda/kernels', n)).read()}\n" for n in names)
fnv = 0xCBF29CE484222325
for b in src.encode():
    fnv = ((fnv ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
lib = ctypes.CDLL(os.path.join(a.nv, "lib/libnvrtc.so.13"))
prog = ctypes.c_void_p()
assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"quarrel.cu", 0, None, None) == 0
opts = [f"--gpu-architecture=compute_{a.arch}".encode(), b"--std=c++17"]
rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
n = ctypes.c_size_t()
lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
log = ctypes.create_string_buffer(n.value)
lib.nvrtcGetProgramLog(prog, log)
print(f"NVRTC ({', '.join(names)}): rc {rc}\n{log.value.decode()}")
if rc != 0:
    sys.exit(1)
lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
ptx = ctypes.create_string_buffer(n.value)
lib.nvrtcGetPTX(prog, ptx)
with tempfile.TemporaryDirectory() as d:
    open(f"{d}/k.ptx", "wb").write(ptx.value)
    r = subprocess.run([os.path.join(a.nv, "bin/ptxas"), f"-arch=sm_{a.arch}", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"], capture_output=True, text=True)
    if a.cache and r.returncode == 0:
        os.makedirs(a.cache, exist_ok=True)
        open(os.path.join(a.cache, f"{fnv:016x}-compute_{a.arch}.ptx"), "wb").write(ptx.value)
        open(os.path.join(a.cache, f"{fnv:016x}-sm_{a.arch}.cubin"), "wb").write(open(f"{d}/k.cubin", "rb").read())
        print(f"cache: {a.cache}/{fnv:016x}-{{compute,sm}}_{a.arch}")
fn = None
for line in r.stderr.splitlines():
    m = re.search(r"Compiling entry function '(\w+)'", line)
    if m:
        fn = m.group(1)
    m = re.search(r"(\d+) bytes spill stores", line)
    if m and int(m.group(1)) > 0:
        print(f"{fn}: {line.strip()}")
    m = re.search(r"Used (\d+) registers", line)
    if m:
        print(f"{fn}: {m.group(1)} registers")
    if "error" in line.lower():
        print(line)
print(f"ptxas sm_{a.arch}: rc {r.returncode}")
sys.exit(r.returncode)
