#!/usr/bin/env bash
# Starts `redline serve` (bundled stories260K) on 127.0.0.1 with a random free port and an
# API key from a file, runs the client tests against it, then stops it with SIGTERM and
# checks that it drains and exits. Usage: tests/clients/run.sh [path/to/redline]
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-target/debug/redline}
WORK=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -c 'import secrets; print("rl-" + secrets.token_hex(16))' > "$WORK/key"
"$BIN" serve --host 127.0.0.1 --port "$PORT" --parallel 8 -c 8192 --api-key-file "$WORK/key" \
  --shutdown-grace 20 > "$WORK/server.log" 2>&1 &
PID=$!
cleanup() {
  if kill -0 "$PID" 2>/dev/null; then kill -KILL "$PID" 2>/dev/null || true; fi
  echo "--- server log (last 40 lines) ---"; tail -n 40 "$WORK/server.log" || true
  rm -rf "$WORK"
}
trap cleanup EXIT
export REDLINE_URL="http://127.0.0.1:$PORT" REDLINE_KEY="$(cat "$WORK/key")" REDLINE_PID="$PID"
for _ in $(seq 1 120); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$REDLINE_URL/health")" = 200 ] && break
  kill -0 "$PID" 2>/dev/null || { echo "server exited"; exit 1; }
  sleep 0.5
done
grep -q "offloaded" "$WORK/server.log" || { echo "no offload line in the log"; exit 1; }

bash tests/clients/curl_test.sh
python3 -m unittest -v tests/clients/test_openai_client.py 2>&1
python3 tests/clients/load_test.py
if [ -n "${CHROMIUM:-}" ] || command -v chromium > /dev/null; then
  python3 tests/clients/page_test.py
fi

# SIGTERM while a stream runs: the stream still finishes, then the process exits.
curl -sfN --max-time 60 -H "Authorization: Bearer $REDLINE_KEY" -H 'Content-Type: application/json' \
  "$REDLINE_URL/v1/completions" -d '{"prompt":"Once","max_tokens":400,"stream":true,"ignore_eos":true}' > "$WORK/stream.txt" &
CURL=$!
sleep 0.3
kill -TERM "$PID"
wait "$CURL" || { echo "stream broken by SIGTERM"; exit 1; }
tail -n 1 "$WORK/stream.txt" | grep -q '\[DONE\]' || grep -q 'data: \[DONE\]' "$WORK/stream.txt" || { echo "stream did not finish"; exit 1; }
for _ in $(seq 1 40); do kill -0 "$PID" 2>/dev/null || break; sleep 0.5; done
if kill -0 "$PID" 2>/dev/null; then echo "server still running 20 s after SIGTERM"; exit 1; fi
wait "$PID" || true
echo "client tests: all passed"
