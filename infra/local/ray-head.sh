#!/usr/bin/env bash
# A real Ray cluster on this machine, on loopback only, for development and tests.
#   infra/local/ray-head.sh start [GCS_PORT] [DASHBOARD_PORT]   a head: GCS 127.0.0.1:6379, Jobs API http://127.0.0.1:8265
#   infra/local/ray-head.sh worker [GCS_PORT]                     a worker node joining it (one CPU by default)
#   infra/local/ray-head.sh stop                                 ends exactly what start/worker launched
# Then: pexec submit jobs/demo.toml --address http://127.0.0.1:8265
#
# Every service binds 127.0.0.1: every node's IP is 127.0.0.1, which Ray's servers take as "listen on
# loopback only". Ray's CLI replaces a loopback address by the machine's external one unless
# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 says the cluster is this host (set for the head, inherited by the
# drivers it runs); a worker node, which Ray refuses under that setting, starts through ray_worker_node.py.
# Each `ray start` runs in its own session, whose id goes into $PEXEC_RAY_TMP/pexec-sessions; `stop` signals
# those sessions' processes only, never another Ray on the machine.
# Environment: PEXEC_RAY_TMP (Ray's temp dir, short: socket paths are limited; default /tmp/pexec-ray-$UID),
# PEXEC_RAY (the ray executable), PEXEC_HEAD_CPUS / PEXEC_WORKER_CPUS (default 2 / 1), PEXEC_RAY_CLIENT_PORT
# (default 10001).
set -euo pipefail
# Loopback only, so Ray's token authentication is off unless the caller turns it on.
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
ray="${PEXEC_RAY:-$root/.venv/bin/ray}"
tmp="${PEXEC_RAY_TMP:-/tmp/pexec-ray-$(id -u)}"
sessions="$tmp/pexec-sessions"
mkdir -p "$tmp"

launch() {  # run a `ray start` command as the leader of a new session and record that session
  [ -x "$ray" ] || { echo "error: no ray at $ray (set PEXEC_RAY, or run make install)" >&2; exit 2; }
  setsid "$@" --disable-usage-stats --temp-dir="$tmp" &
  local leader=$!
  echo "$leader" >> "$sessions"
  wait "$leader"
}

case "${1:-start}" in
  start)
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 launch "$ray" start --head --node-ip-address=127.0.0.1 --port="${2:-6379}" \
      --dashboard-host=127.0.0.1 --dashboard-port="${3:-8265}" --dashboard-agent-listen-port=0 \
      --ray-client-server-port="${PEXEC_RAY_CLIENT_PORT:-10001}" --num-cpus="${PEXEC_HEAD_CPUS:-2}" ;;
  worker)
    launch "$(dirname "$ray")/python" "$(dirname "$0")/ray_worker_node.py" start --address="127.0.0.1:${2:-6379}" \
      --node-ip-address=127.0.0.1 --dashboard-agent-listen-port=0 --num-cpus="${PEXEC_WORKER_CPUS:-1}" ;;
  stop)
    [ -f "$sessions" ] || exit 0
    leaders=$(sort -u "$sessions")
    for signal in TERM KILL; do  # politely, then for sure; each time wait up to 5 s for them to be gone
      for sid in $leaders; do pkill "-$signal" -s "$sid" || true; done
      for _ in $(seq 50); do
        alive=0
        for sid in $leaders; do pgrep -s "$sid" -r R,S,D,T,t >/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
      done
    done
    rm -f "$sessions" ;;
  *)
    echo "usage: $0 start [GCS_PORT] [DASHBOARD_PORT] | worker [GCS_PORT] | stop" >&2; exit 2 ;;
esac
