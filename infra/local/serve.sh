#!/usr/bin/env bash
# The local servers the how-to guides use, in the background on 127.0.0.1, each from the environment the tests
# run it from:
#   infra/local/serve.sh start mlflow [PORT]    MLflow tracking server (default 5000; .venv/servers/mlflow)
#   infra/local/serve.sh start phoenix [PORT]   Phoenix, OTLP over HTTP on the same port (default 6006; gRPC on
#                                               PORT+1; .venv/servers/phoenix)
#   infra/local/serve.sh start s3 [PORT]        an S3-compatible store, moto (default 5555; .venv)
#   infra/local/serve.sh stop NAME              stops what `start NAME` started (its process group), nothing else
# `start` returns once the server answers (up to PEXEC_SERVE_TIMEOUT seconds, default 300: a first start creates
# its database) and prints its URL; a server already started is left as it is. Each keeps its database, log and
# process id under $PEXEC_SERVE_DIR/NAME (default out/servers/NAME). `make mlflow-server`, `make phoenix-server`
# build the server's environment first (tests/servers/NAME.txt) and call this.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
action="${1:-}"; name="${2:-}"
case "$name" in
  mlflow) port="${3:-5000}"; python="$root/.venv/servers/mlflow/bin/python"; health=/health ;;
  phoenix) port="${3:-6006}"; python="$root/.venv/servers/phoenix/bin/python"; health=/healthz ;;
  s3) port="${3:-5555}"; python="${PEXEC_PYTHON:-$root/.venv/bin/python}"; health=/moto-api/ ;;
  *) echo "usage: $0 start|stop mlflow|phoenix|s3 [PORT]" >&2; exit 2 ;;
esac
dir="${PEXEC_SERVE_DIR:-$root/out/servers}/$name"
pidfile="$dir/pid"
log="${dir#"$PWD"/}/log"  # as the reader's shell names it
url="http://127.0.0.1:$port"

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

answers() {  # the server's health URL answers 200
  "$root/.venv/bin/python" - "$url$health" <<'PY'
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=2) as response:
        sys.exit(0 if response.status == 200 else 1)
except OSError:
    sys.exit(1)
PY
}

case "$action" in
  start)
    if running; then echo "$name already serving (pid $(cat "$pidfile"); log $log)"; exit 0; fi
    [ -x "$python" ] || { echo "error: no $python (make $name-server builds it)" >&2; exit 2; }
    mkdir -p "$dir"
    case "$name" in
      # No job runner: it starts some eight worker processes for server-side jobs nobody runs here.
      mlflow) MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false setsid "$python" -m mlflow server --host 127.0.0.1 \
                --port "$port" --backend-store-uri "sqlite:///$dir/mlflow.db" --default-artifact-root "$dir/artifacts" \
                --workers 1 >"$dir/log" 2>&1 </dev/null & ;;
      phoenix) PHOENIX_WORKING_DIR="$dir" PHOENIX_HOST=127.0.0.1 PHOENIX_PORT="$port" PHOENIX_GRPC_PORT=$((port + 1)) \
                 PHOENIX_TELEMETRY_ENABLED=false setsid "$python" -m phoenix.server.main serve >"$dir/log" 2>&1 </dev/null & ;;
      s3) setsid "$python" -m moto.server -H 127.0.0.1 -p "$port" >"$dir/log" 2>&1 </dev/null & ;;
    esac
    echo $! > "$pidfile"
    deadline=$((SECONDS + ${PEXEC_SERVE_TIMEOUT:-300}))
    until answers; do
      if ! running; then echo "error: $name exited while starting; the end of $dir/log:" >&2; tail -5 "$dir/log" >&2
                         rm -f "$pidfile"; exit 1; fi
      if [ "$SECONDS" -ge "$deadline" ]; then echo "error: $name did not answer at $url within ${PEXEC_SERVE_TIMEOUT:-300} s (log $dir/log)" >&2
                                             "$0" stop "$name"; exit 1; fi
      sleep 1
    done
    printf '%s serving at %s\n  log %s; stop: infra/local/serve.sh stop %s\n' "$name" "$url" "$log" "$name" ;;
  stop)
    if ! running; then rm -f "$pidfile"; echo "$name not running"; exit 0; fi
    pid="$(cat "$pidfile")"
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$pidfile"
    echo "$name stopped" ;;
  *) echo "usage: $0 start|stop mlflow|phoenix|s3 [PORT]" >&2; exit 2 ;;
esac
