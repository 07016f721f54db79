#!/usr/bin/env bash
# curl against a running `redline serve`: health, auth, whole and streamed completions,
# tokenize round trip, metrics, error statuses. Env: REDLINE_URL, REDLINE_KEY.
set -euo pipefail
: "${REDLINE_URL:?}" "${REDLINE_KEY:?}"
AUTH=(-H "Authorization: Bearer $REDLINE_KEY")
JSON=(-H "Content-Type: application/json")
# Matches read here-strings, not `echo | grep -q`: under pipefail, grep -q exits at its first
# match and a writer still holding more than a pipe write of text dies of SIGPIPE, failing the
# check at random (CI, stop 37: "metric redline_prompt_tokens_total missing").
fail() { echo "curl_test: FAIL: $*" >&2; exit 1; }
status() { curl -s -o /dev/null -w '%{http_code}' --max-time 60 "$@"; }
field() { python3 -c "import json,sys; v=json.load(sys.stdin); print(eval('v'+sys.argv[1]))" "$1"; }

[ "$(status "$REDLINE_URL/health")" = 200 ] || fail "/health without a key"
[ "$(status "$REDLINE_URL/v1/models")" = 401 ] || fail "/v1/models without a key must be 401"
[ "$(status -H 'Authorization: Bearer wrong' "$REDLINE_URL/v1/models")" = 401 ] || fail "wrong key must be 401"
[ "$(status "${AUTH[@]}" "$REDLINE_URL/v1/models")" = 200 ] || fail "/v1/models with the key"
[ "$(status "${AUTH[@]}" "$REDLINE_URL/v1/nope")" = 404 ] || fail "unknown route must be 404"

out=$(curl -sf --max-time 60 "${AUTH[@]}" "${JSON[@]}" "$REDLINE_URL/v1/chat/completions" \
  -d '{"model":"x","messages":[{"role":"user","content":"Hello"}],"max_tokens":8}')
[ "$(echo "$out" | field '["usage"]["completion_tokens"]')" = 8 ] || fail "chat usage: $out"
[ "$(echo "$out" | field '["choices"][0]["message"]["role"]')" = assistant ] || fail "chat role: $out"

sse=$(curl -sfN --max-time 60 "${AUTH[@]}" "${JSON[@]}" "$REDLINE_URL/v1/completions" \
  -d '{"prompt":"Once upon a time","max_tokens":6,"stream":true,"stream_options":{"include_usage":true}}')
[ "$(echo "$sse" | grep -c '^data: ')" -ge 8 ] || fail "too few SSE events: $sse"
[ "$(echo "$sse" | grep '^data: ' | tail -1)" = "data: [DONE]" ] || fail "stream must end with [DONE]"
grep -q '"completion_tokens":6' <<< "$sse" || fail "stream usage missing"

ids=$(curl -sf "${AUTH[@]}" "${JSON[@]}" "$REDLINE_URL/tokenize" -d '{"content":"Once upon a time"}' | field '["tokens"]')
text=$(curl -sf "${AUTH[@]}" "${JSON[@]}" "$REDLINE_URL/detokenize" -d "{\"tokens\":$ids}" | field '["content"]')
[ "$(echo "$text" | sed 's/^ //')" = "Once upon a time" ] || fail "tokenize round trip gave '$text'"

[ "$(status "${AUTH[@]}" "${JSON[@]}" "$REDLINE_URL/v1/chat/completions" -d '{"messages":[{"role":"user","content":"x"}],"temperature":7}')" = 400 ] || fail "bad temperature must be 400"
[ "$(status "${AUTH[@]}" "${JSON[@]}" "$REDLINE_URL/v1/chat/completions" -d '{not json')" = 400 ] || fail "bad JSON must be 400"
big=$(mktemp); python3 -c "import json; print(json.dumps({'prompt': 'x' * (9 << 20)}))" > "$big"
[ "$(status "${AUTH[@]}" "${JSON[@]}" "$REDLINE_URL/v1/completions" --data-binary "@$big")" = 413 ] || fail "9 MB body must be 413"
rm -f "$big"

metrics=$(curl -sf "${AUTH[@]}" "$REDLINE_URL/metrics")
for m in redline_requests_total redline_prompt_tokens_total redline_generated_tokens_total redline_decode_tokens_per_second \
         redline_prefill_tokens_per_second redline_queue_depth redline_slots_busy redline_kv_cache_usage_ratio; do
  grep -q "^$m " <<< "$metrics" || fail "metric $m missing"
done
page=$(curl -sf "$REDLINE_URL/")
grep -qi '<html' <<< "$page" || fail "chat page missing"
echo "curl_test: all passed"
