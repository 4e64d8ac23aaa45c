#!/usr/bin/env bash
# Build the worker image from infra/Dockerfile with buildah (a Debian package; no daemon) and smoke-test it
# with `pexec --version` inside. `make image` runs it.
#   infra/local/build-image.sh IMAGE [BASE]
# BASE is the Ray base image (default: the Dockerfile's, pulled from Docker Hub), or `debian`: the stand-in
# infra/local/debian-base.sh bootstraps from Debian packages (built once), for a machine that reaches
# deb.debian.org and PyPI but no container registry.
# Environment: BUILDAH_ISOLATION (default chroot: inside a container the OCI runtime's cgroup and rlimit
# setup is refused); PEXEC_BUILD_CA, a CA bundle file that the build's RUN steps (and their pip) trust, for a
# network that intercepts TLS: mounted read-only over the base's bundles during the build, so nothing of it
# stays in the image.
set -euo pipefail
image="${1:?usage: $0 IMAGE [BASE]}"
base="${2:-}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
export BUILDAH_ISOLATION="${BUILDAH_ISOLATION:-chroot}"
args=(--network host --layers -f "$root/infra/Dockerfile" -t "$image")
if [ "$base" = debian ]; then
  base=localhost/pexec-debian-base:bookworm
  buildah inspect --type image "$base" >/dev/null 2>&1 || "$root/infra/local/debian-base.sh" "$base"
fi
[ -z "$base" ] || args+=(--build-arg "RAY_BASE=$base")
if [ -n "${PEXEC_BUILD_CA:-}" ]; then
  args+=(--volume "$PEXEC_BUILD_CA:/etc/ssl/certs/ca-certificates.crt:ro")
  # The stand-in's pip (Debian's 23.0) trusts only its own bundle, not the system's.
  pip_ca=/home/ray/venv/lib/python3.11/site-packages/pip/_vendor/certifi/cacert.pem
  [ "$base" != localhost/pexec-debian-base:bookworm ] || args+=(--volume "$PEXEC_BUILD_CA:$pip_ca:ro")
fi
buildah bud "${args[@]}" "$root"
container="$(buildah from "$image")"
buildah run "$container" -- pexec --version || { buildah rm "$container" >/dev/null; exit 1; }
buildah rm "$container" >/dev/null
