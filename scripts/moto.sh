#!/usr/bin/env bash
# Starts and stops a local moto server (the AWS API emulator) for the AWS provider's tests.
#
#   scripts/moto.sh start   install moto[server] if missing, start it on a free loopback port,
#                           wait until it answers, print its endpoint (http://127.0.0.1:PORT).
#                           Reuses a server this state dir already runs.
#   scripts/moto.sh stop    stop the server this state dir runs.
#   scripts/moto.sh port    print the port of the running server.
#
# Environment:
#   MOTO_VERSION     moto version to install (default below).
#   MOTO_VENV        virtualenv holding moto (default: $CARGO_TARGET_DIR or ./target, /moto-venv).
#   MOTO_STATE_DIR   where pid, port and log live (default: <target>/moto).
#   MOTO_OWNER_PID   when set, a watchdog stops the server once that process exits (tests pass
#                    their own pid so no server outlives `cargo test`).
set -euo pipefail

MOTO_VERSION="${MOTO_VERSION:-5.2.5}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
venv="${MOTO_VENV:-$target/moto-venv}"
state="${MOTO_STATE_DIR:-$target/moto}"
pidfile="$state/pid"
portfile="$state/port"
logfile="$state/moto.log"

die() {
    echo "moto.sh: $*" >&2
    exit 1
}

running() {
    [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

ready() {
    # moto's own management API answers once the server is up.
    "$venv/bin/python" - "$1" <<'EOF' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/moto-api/data.json", timeout=2).read()
EOF
}

install() {
    if [[ -x "$venv/bin/moto_server" ]] \
        && "$venv/bin/python" -c "import moto, sys; sys.exit(moto.__version__ != '$MOTO_VERSION')" 2>/dev/null; then
        return
    fi
    command -v python3 >/dev/null || die "python3 is needed to install moto; install it (apt-get install python3-venv)"
    echo "moto.sh: installing moto[server]==$MOTO_VERSION into $venv" >&2
    mkdir -p "$(dirname "$venv")"
    [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv" >&2 \
        || die "cannot create a virtualenv at $venv (apt-get install python3-venv?)"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "moto[server]==$MOTO_VERSION" >&2 \
        || die "pip could not install moto[server]==$MOTO_VERSION into $venv"
}

free_port() {
    "$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

start() {
    install
    mkdir -p "$state"
    if running && ready "$(cat "$portfile")"; then
        echo "http://127.0.0.1:$(cat "$portfile")"
        return
    fi
    local port pid
    port="$(free_port)"
    # setsid: the server must not die with the shell that started it (nor take signals meant
    # for the test runner's process group).
    setsid "$venv/bin/moto_server" -H 127.0.0.1 -p "$port" >"$logfile" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$pidfile"
    echo "$port" >"$portfile"
    if [[ -n "${MOTO_OWNER_PID:-}" ]]; then
        local owner="$MOTO_OWNER_PID"
        setsid bash -c "while kill -0 $owner 2>/dev/null && kill -0 $pid 2>/dev/null; do sleep 1; done; kill $pid 2>/dev/null; rm -rf '$state'" \
            >/dev/null 2>&1 </dev/null &
    fi
    for _ in $(seq 1 300); do
        if ready "$port"; then
            echo "http://127.0.0.1:$port"
            return
        fi
        kill -0 "$pid" 2>/dev/null || die "moto_server exited during start-up; log $logfile: $(tail -n 20 "$logfile")"
        sleep 0.1
    done
    kill "$pid" 2>/dev/null || true
    die "moto_server did not answer on 127.0.0.1:$port within 30 s; log $logfile: $(tail -n 20 "$logfile")"
}

stop() {
    if running; then
        kill "$(cat "$pidfile")"
    fi
    rm -f "$pidfile" "$portfile"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
port)
    running || die "no moto server runs for state dir $state"
    cat "$portfile"
    ;;
*) die "usage: $0 start|stop|port" ;;
esac
