#!/usr/bin/env bash
# A real S3-compatible server on loopback for development and tests: moto in server mode.
#   infra/local/s3-server.sh [PORT]      (default 5555; stop it with Ctrl-C or kill)
# Point pexec at it with `--endpoint-url http://127.0.0.1:PORT` and any AWS_ACCESS_KEY_ID/SECRET pair.
set -euo pipefail
port="${1:-5555}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
exec "${PEXEC_PYTHON:-$root/.venv/bin/python}" -m moto.server -H 127.0.0.1 -p "$port"
