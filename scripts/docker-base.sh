#!/usr/bin/env bash
# Makes the Debian base image the Dockerfiles in deploy/ start from, without an image
# registry: debootstrap a minimal Debian into a directory and `docker import` it.
#
#   scripts/docker-base.sh [TAG] [SUITE] [MIRROR]
#   defaults: quarrel-base:bookworm, bookworm, http://deb.debian.org/debian
#
# Where Docker Hub is reachable, `docker pull debian:bookworm-slim` and
# `--build-arg BASE=debian:bookworm-slim` do the same.
set -euo pipefail
TAG="${1:-quarrel-base:bookworm}"
SUITE="${2:-bookworm}"
MIRROR="${3:-http://deb.debian.org/debian}"
command -v debootstrap >/dev/null || { echo "debootstrap is needed: apt-get install debootstrap" >&2; exit 1; }
command -v docker >/dev/null || { echo "docker is needed: apt-get install docker.io" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "debootstrap needs root" >&2; exit 1; }
ROOT="$(mktemp -d)"
trap 'rm -rf "$ROOT"' EXIT
# minbase: dpkg, apt and essential packages only; ca-certificates for HTTPS downloads in builds
debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$ROOT" "$MIRROR"
# a container image needs no package caches, docs or man pages, and apt should keep it so
cat >"$ROOT/etc/apt/apt.conf.d/docker-clean" <<'CONF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb || true"; };
APT::Install-Recommends "false";
CONF
cat >"$ROOT/etc/dpkg/dpkg.cfg.d/docker-nodoc" <<'CONF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
CONF
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/locale/*
tar --numeric-owner -C "$ROOT" -c . |
  docker import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - "$TAG"
docker image ls "$TAG"
