#!/usr/bin/env bash
# The safe model switch: stop the running llm-server gracefully, start it on another model, wait until
# /health says ok.
#
#   scripts/switch-model.sh [options] MODEL.gguf [-- SERVER FLAGS...]
#
#   --bin PATH        the server binary (default: llm-server next to this script's repo, else on PATH)
#   --host H          (default 127.0.0.1)      --port P   (default 8080)
#   --pid-file F      where the running server's pid is kept (default /tmp/llm-server-PORT.pid); the
#                     flags it was started with are kept in F.args and reused unless new ones follow --
#   --log F           server log (default /tmp/llm-server-PORT.log, appended)
#   --timeout S       how long to wait for /health (default 90)
#   --stop-timeout S  how long the old server may take to drain (default 30; then SIGKILL)
#
# Without a pid file, the process listening on the port is found with ss(8) (it must be an llm-server).
# Exit status: 0 when the new server is healthy; 1 with a message saying what failed otherwise (the log's
# tail is printed).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="" HOST=127.0.0.1 PORT=8080 PIDFILE="" LOG="" TIMEOUT=90 STOP_TIMEOUT=30 MODEL=""
EXTRA=() HAVE_EXTRA=0

die() { echo "switch-model: error: $*" >&2; exit 1; }
say() { echo "switch-model: $*"; }

while [ $# -gt 0 ]; do
    case "$1" in
        --bin) BIN="$2"; shift 2 ;;
        --host) HOST="$2"; shift 2 ;;
        --port) PORT="$2"; shift 2 ;;
        --pid-file) PIDFILE="$2"; shift 2 ;;
        --log) LOG="$2"; shift 2 ;;
        --timeout) TIMEOUT="$2"; shift 2 ;;
        --stop-timeout) STOP_TIMEOUT="$2"; shift 2 ;;
        --) shift; EXTRA=("$@"); HAVE_EXTRA=1; break ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        -*) die "unknown option $1" ;;
        *) [ -z "$MODEL" ] || die "more than one model given"; MODEL="$1"; shift ;;
    esac
done
[ -n "$MODEL" ] || die "no model given (usage: switch-model.sh [options] MODEL.gguf [-- SERVER FLAGS])"
[ -r "$MODEL" ] || die "cannot read model $MODEL"
if [ -z "$BIN" ]; then
    if [ -x "$ROOT/llm-server" ]; then BIN="$ROOT/llm-server"; else BIN="$(command -v llm-server || true)"; fi
fi
[ -n "$BIN" ] && [ -x "$BIN" ] || die "llm-server binary not found (use --bin)"
PIDFILE="${PIDFILE:-/tmp/llm-server-$PORT.pid}"
LOG="${LOG:-/tmp/llm-server-$PORT.log}"

health() {  # prints the HTTP status of /health, 000 when nothing answers
    if command -v curl >/dev/null; then
        curl -s -o /dev/null -m 2 -w '%{http_code}' "http://$HOST:$PORT/health" 2>/dev/null || true
    else
        python3 - "$HOST" "$PORT" <<'EOF' 2>/dev/null || echo 000
import http.client, sys
c = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]), timeout=2)
c.request("GET", "/health"); print(c.getresponse().status, end="")
EOF
    fi
}

# ---- 1. stop the running server ------------------------------------------------------------------
OLD=""
if [ -s "$PIDFILE" ]; then
    OLD="$(cat "$PIDFILE")"
    kill -0 "$OLD" 2>/dev/null || OLD=""
fi
if [ -z "$OLD" ] && command -v ss >/dev/null; then
    OLD="$(ss -Hltnp "sport = :$PORT" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2 || true)"
    if [ -n "$OLD" ] && ! tr '\0' ' ' < "/proc/$OLD/cmdline" | grep -q 'llm-server'; then
        die "port $PORT is held by pid $OLD, which is not an llm-server"
    fi
fi
if [ -n "$OLD" ]; then
    # Reuse the flags the old server ran with, unless new ones were given.
    if [ "$HAVE_EXTRA" = 0 ] && [ -s "$PIDFILE.args" ]; then mapfile -t EXTRA < "$PIDFILE.args"; fi
    say "stopping pid $OLD (SIGTERM: in-flight requests finish, up to ${STOP_TIMEOUT} s)"
    kill -TERM "$OLD" 2>/dev/null || true
    for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
        kill -0 "$OLD" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$OLD" 2>/dev/null; then
        say "pid $OLD still running after ${STOP_TIMEOUT} s: SIGKILL"
        kill -KILL "$OLD" 2>/dev/null || true
        sleep 0.5
    fi
    say "stopped"
elif [ "$(health)" != 000 ]; then
    die "something answers on $HOST:$PORT but no llm-server pid was found (pid file $PIDFILE)"
else
    say "no server running on $HOST:$PORT"
fi

# ---- 2. start the new one ------------------------------------------------------------------------
say "starting $BIN -m $MODEL --host $HOST --port $PORT ${EXTRA[*]:-}"
echo "---- $(date -u +%Y-%m-%dT%H:%M:%SZ) switch-model: $MODEL" >> "$LOG"
nohup "$BIN" -m "$MODEL" --host "$HOST" --port "$PORT" "${EXTRA[@]}" >> "$LOG" 2>&1 < /dev/null &
NEW=$!
echo "$NEW" > "$PIDFILE"
printf '%s\n' "${EXTRA[@]}" > "$PIDFILE.args"

# ---- 3. wait for /health ---------------------------------------------------------------------------
START=$(date +%s)
while :; do
    code="$(health)"
    if [ "$code" = 200 ]; then
        say "healthy after $(( $(date +%s) - START )) s: pid $NEW serves $MODEL on $HOST:$PORT"
        exit 0
    fi
    if ! kill -0 "$NEW" 2>/dev/null; then
        echo "---- last lines of $LOG:" >&2; tail -n 20 "$LOG" >&2
        die "the new server (pid $NEW) exited before becoming healthy"
    fi
    if [ $(( $(date +%s) - START )) -ge "$TIMEOUT" ]; then
        echo "---- last lines of $LOG:" >&2; tail -n 20 "$LOG" >&2
        die "the new server (pid $NEW) was not healthy within $TIMEOUT s (last /health status: $code); it is left running"
    fi
    sleep 0.5
done
