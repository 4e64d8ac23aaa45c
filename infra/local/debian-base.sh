#!/usr/bin/env bash
# A stand-in for the Ray base image, bootstrapped from Debian packages, for a machine that reaches
# deb.debian.org but no container registry: Debian bookworm (python3.11) with a virtualenv owned by the
# non-root user `ray` (uid 1000, gid 100) first on PATH, as rayproject/ray has its Python. Ray itself comes
# from PyPI when infra/Dockerfile installs the pinned dependencies on top of it.
#   infra/local/debian-base.sh [IMAGE]     default IMAGE: localhost/pexec-debian-base:bookworm
# Needs mmdebstrap and buildah (Debian packages) and root.
set -euo pipefail
image="${1:-localhost/pexec-debian-base:bookworm}"
mirror="${PEXEC_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

mmdebstrap --variant=minbase --include=python3.11,python3.11-venv,ca-certificates \
  --customize-hook='chroot "$1" useradd --uid 1000 --gid 100 --create-home ray' \
  --customize-hook='chroot "$1" python3.11 -m venv /home/ray/venv' \
  --customize-hook='chroot "$1" chown -R 1000:100 /home/ray' \
  bookworm "$work/rootfs.tar" "$mirror"

container="$(buildah from scratch)"
trap 'buildah rm "$container" >/dev/null; rm -rf "$work"' EXIT
buildah add "$container" "$work/rootfs.tar" /
buildah config --env PATH=/home/ray/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --user 1000 --workingdir /home/ray --cmd /bin/bash "$container"
buildah commit --quiet "$container" "$image"
