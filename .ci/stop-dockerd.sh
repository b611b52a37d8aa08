#!/bin/sh
# Stop the dockerd that .ci/start-dockerd.sh started (by its PID file), and only that one.
# Idempotent: no PID file or a dead PID is not an error.
set -eu

PIDFILE=${HANGWATCH_DOCKER_PIDFILE:-/run/hangwatch-dockerd.pid}
DEADLINE=${HANGWATCH_DOCKER_DEADLINE:-30}

[ -f "$PIDFILE" ] || { echo "stop-dockerd: no $PIDFILE; nothing to stop"; exit 0; }
pid=$(cat "$PIDFILE")
if ! kill -0 "$pid" 2>/dev/null; then
    echo "stop-dockerd: dockerd $pid is not running"
    rm -f "$PIDFILE"
    exit 0
fi
kill -TERM "$pid"
waited=0
while kill -0 "$pid" 2>/dev/null; do
    if [ "$waited" -ge "$DEADLINE" ]; then
        echo "stop-dockerd: dockerd $pid ignored SIGTERM for ${DEADLINE}s; SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
        break
    fi
    sleep 1
    waited=$((waited + 1))
done
rm -f "$PIDFILE"
echo "stop-dockerd: stopped dockerd $pid"
