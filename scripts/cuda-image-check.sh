#!/usr/bin/env bash
# Checks the CUDA image on a GPU host that has no Docker: the image's own filesystem, binary and
# environment, run under chroot as the image's user, find the GPU.
#
#   scripts/cuda-image-check.sh export [IMAGE] [OUT.tar.xz]     where the image was built
#   scripts/cuda-image-check.sh run ROOTFS.tar.xz ['ARGS'...]    as root on the GPU host
#
# `export` writes the image's filesystem without its NVRTC and cuBLAS libraries (hundreds of
# megabytes; their names and sizes go into /opt/cuda/lib64/MANIFEST) and with the image's
# configuration (user, environment, entry point) in /.image-config.json. `run` unpacks it, puts
# into /opt/cuda/lib64 the host's copies of the libraries the manifest names (the same NVIDIA
# wheels, nvidia-cublas and nvidia-cuda-nvrtc, from the host's Python, else the CUDA toolkit's),
# adds the driver's libraries and devices as the NVIDIA container toolkit does, and runs the
# image's entry point with each ARGS in turn (words; default: `gpu`, i.e. `quarrel gpu`) as its
# user, in its working directory, with its environment only.
set -euo pipefail

export_image() {
  local image=${1:-quarrel:cuda} out=${2:-quarrel-cuda-rootfs.tar.xz}
  local dir id
  dir=$(mktemp -d)
  chmod 755 "$dir" # the archive's root directory: the image user must be able to enter it
  trap 'rm -rf "$dir"; [ -n "${id:-}" ] && docker rm -f "$id" >/dev/null' RETURN
  id=$(docker create "$image")
  docker export "$id" | tar -x -C "$dir" --exclude='dev/*'
  docker image inspect "$image" --format '{{json .Config}}' >"$dir/.image-config.json"
  (cd "$dir/opt/cuda/lib64" && find . -maxdepth 1 -type f -printf '%f %s\n' | sort >"$dir/MANIFEST" &&
    find . -maxdepth 1 -type f -delete && mv "$dir/MANIFEST" MANIFEST)
  tar --numeric-owner -C "$dir" -c . | xz -T0 -6 >"$out"
  echo "$out: $(du -h "$out" | cut -f1) (image $(docker image inspect "$image" --format '{{.Size}}' | numfmt --to=iec))"
  sed 's/^/  left out: /' "$dir/opt/cuda/lib64/MANIFEST"
}

# The host's copy of library NAME (a file name from the manifest: libcublas.so.13.1.0.3 is
# matched by its soname stem libcublas.so.13).
host_lib() {
  local name=$1 stem dirs d f
  stem=$(echo "$name" | sed -E 's/^(lib[^.]+\.so\.[0-9]+).*/\1/')
  dirs=$(python3 - <<'PY' 2>/dev/null || true
import importlib.util, os
for mod in ("nvidia.cu13", "nvidia.cublas", "nvidia.cuda_nvrtc"):
    try:
        s = importlib.util.find_spec(mod)
    except Exception:
        continue
    for p in (s.submodule_search_locations or []) if s else []:
        for root, _, files in os.walk(p):
            if any(f.startswith("lib") and ".so" in f for f in files):
                print(root)
PY
)
  for d in $dirs /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
    for f in "$d/$name" "$d/$stem"*; do
      [ -f "$f" ] && { readlink -f "$f"; return 0; }
    done
  done
  return 1
}

run_rootfs() {
  local tarball=$1
  shift
  [ "$(id -u)" = 0 ] || { echo "run needs root (chroot, bind mounts)" >&2; exit 1; }
  # global: the EXIT trap runs after this function has returned
  ROOT=$(mktemp -d)
  local root=$ROOT
  trap 'for m in dev/pts dev proc sys; do umount "$ROOT/$m" 2>/dev/null || true; done; rm -rf "$ROOT"' EXIT
  xz -dc "$tarball" | tar -x -C "$root"
  chmod 755 "$root"
  local lib64=$root/opt/cuda/lib64
  while read -r name size; do
    local src
    src=$(host_lib "$name") || { echo "warning: the host has no $name; the image's binary goes without it" >&2; continue; }
    cp "$src" "$lib64/$name"
    # another version's file keeps its own name too (libnvrtc opens its builtins by full name)
    [ "$(basename "$src")" = "$name" ] || cp "$src" "$lib64/$(basename "$src")"
    echo "image library $name ($size bytes): host's $(basename "$src") ($(stat -c %s "$src") bytes)"
  done <"$lib64/MANIFEST"
  # the container toolkit's part: the driver's user-space libraries and the device nodes
  local drv=$root/usr/lib/x86_64-linux-gnu
  local n=0
  for f in $(ldconfig -p | awk '/libcuda\.so|libnvidia-ptxjitcompiler|libnvidia-ml\.so|libnvidia-nvvm/ {print $NF}') \
    /usr/local/nvidia/lib64/libcuda.so* /usr/local/nvidia/lib64/libnvidia-ptxjitcompiler.so* /usr/local/nvidia/lib64/libnvidia-ml.so*; do
    [ -e "$f" ] && cp -L "$f" "$drv/$(basename "$f")" && n=$((n + 1))
  done
  [ "$n" -gt 0 ] || { echo "no driver library (libcuda) found on the host" >&2; exit 1; }
  chroot "$root" /sbin/ldconfig
  for m in dev dev/pts proc sys; do mount --bind "/$m" "$root/$m"; done
  local cfg=$root/.image-config.json
  local user entry wd
  wd=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["WorkingDir"] or "/")' "$cfg")
  user=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["User"] or "0")' "$cfg")
  entry=$(python3 -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1]))["Entrypoint"] or []))' "$cfg")
  mapfile -t envs < <(python3 -c 'import json,sys; print("\n".join(json.load(open(sys.argv[1]))["Env"] or []))' "$cfg")
  [ $# -gt 0 ] || set -- gpu
  local args
  for args in "$@"; do
    echo "== as user $user in $wd: $entry $args"
    # shellcheck disable=SC2086 # the entry point and the arguments are words
    chroot --userspec="$user" "$root" /usr/bin/env -i -C "$wd" "${envs[@]}" $entry $args
  done
}

case "${1:-}" in
  export) shift; export_image "$@" ;;
  run) shift; [ $# -ge 1 ] || { echo "usage: $0 run ROOTFS.tar.xz ['ARGS'...]" >&2; exit 2; }; run_rootfs "$@" ;;
  *) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
