#!/usr/bin/env bash
# A real Ray head on this machine (the Jobs API and dashboard on 127.0.0.1:8265) for development and tests.
#   infra/local/ray-head.sh start [GCS_PORT] [DASHBOARD_PORT]   then: pexec submit jobs/demo.toml --address http://127.0.0.1:8265
#   infra/local/ray-head.sh stop
# With PEXEC_RAY_TMP=/tmp/short-dir the head keeps its session files there, and `stop` ends only the
# processes of that head (other Ray instances on the machine are left alone).
set -euo pipefail
# Loopback only, so Ray's token authentication is off unless the caller turns it on.
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
ray="${PEXEC_RAY:-$root/.venv/bin/ray}"
case "${1:-start}" in
  start)
    exec "$ray" start --head --port="${2:-6379}" --dashboard-host=127.0.0.1 --dashboard-port="${3:-8265}" \
      --num-cpus="${PEXEC_HEAD_CPUS:-2}" --disable-usage-stats ${PEXEC_RAY_TMP:+--temp-dir="$PEXEC_RAY_TMP"} ;;
  stop)
    if [ -n "${PEXEC_RAY_TMP:-}" ]; then
      pkill -9 -f -- "$PEXEC_RAY_TMP" || true
    else
      exec "$ray" stop --force
    fi ;;
  *)
    echo "usage: $0 start [GCS_PORT] [DASHBOARD_PORT] | stop" >&2; exit 2 ;;
esac
