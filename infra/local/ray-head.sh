#!/usr/bin/env bash
# A real Ray head on this machine (the Jobs API and dashboard on 127.0.0.1:8265) for development and tests.
#   infra/local/ray-head.sh start [GCS_PORT] [DASHBOARD_PORT]   then: pexec submit jobs/demo.toml --address http://127.0.0.1:8265
#   infra/local/ray-head.sh stop
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
ray="${PEXEC_RAY:-$root/.venv/bin/ray}"
case "${1:-start}" in
  start)
    exec "$ray" start --head --port="${2:-6379}" --dashboard-host=127.0.0.1 --dashboard-port="${3:-8265}" \
      --num-cpus="${PEXEC_HEAD_CPUS:-2}" --disable-usage-stats ;;
  stop)
    exec "$ray" stop --force ;;
  *)
    echo "usage: $0 start [GCS_PORT] [DASHBOARD_PORT] | stop" >&2; exit 2 ;;
esac
