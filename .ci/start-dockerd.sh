#!/bin/sh
# Start a Docker engine for the webhook's real tests, if none answers yet. Idempotent.
#
# No bridge, no firewall rules (containers use --network host; never 172.17/16), its own
# data and exec roots, a PID file so .ci/stop-dockerd.sh stops exactly this one, and a log
# file to read when it does not come up. Exit 0 once `docker info` answers; 1 on timeout.
set -eu

ROOT=${HANGWATCH_DOCKER_ROOT:-/var/lib/hangwatch-docker}
PIDFILE=${HANGWATCH_DOCKER_PIDFILE:-/run/hangwatch-dockerd.pid}
LOG=${HANGWATCH_DOCKER_LOG:-$ROOT/dockerd.log}
DEADLINE=${HANGWATCH_DOCKER_DEADLINE:-60}

if docker info >/dev/null 2>&1; then
    echo "start-dockerd: an engine already answers; nothing started"
    exit 0
fi
if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    echo "start-dockerd: dockerd $(cat "$PIDFILE") is running but not answering yet; waiting"
else
    mkdir -p "$ROOT/data" "$ROOT/exec"
    dockerd --bridge=none --iptables=false --ip6tables=false \
        --data-root "$ROOT/data" --exec-root "$ROOT/exec" --pidfile "$PIDFILE" \
        >>"$LOG" 2>&1 &
    echo "start-dockerd: started dockerd (pid $!), log $LOG"
fi

waited=0
until docker info >/dev/null 2>&1; do
    if [ "$waited" -ge "$DEADLINE" ]; then
        echo "start-dockerd: not ready after ${DEADLINE}s; last log lines:" >&2
        tail -n 20 "$LOG" >&2 || true
        exit 1
    fi
    sleep 1
    waited=$((waited + 1))
done
echo "start-dockerd: ready after ${waited}s"
