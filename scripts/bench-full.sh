#!/usr/bin/env bash
# The full GPU benchmark (issues #4.6, #5.4, #6.7) for the H200 device machine. Builds nothing:
# it runs a carried release `redline` (default devbin/cli-gpu/redline; REDLINE=... overrides).
#
#   - `redline synth` the Qwen2.5-32B and Qwen3.5-27B shapes at Q4_K_M, IQ4_XS and Q4_0 into
#     /tmp, the next file written in the background while the current one is measured (at
#     most two on the 64 GB disk; each deleted after use);
#   - `redline bench --device cuda -p 512 -n 128 -r 3` on each (pp512, tg128 mean ± sd and the
#     % of the roofline measured in the same run), plus `-d 4096` on the 32B Q4_K_M;
#   - a `--vram-limit 16G` partial-offload bench on the 32B IQ4_XS (17.4 GB);
#   - a serve load test on the 32B Q4_K_M at 1, 8 and 32 concurrent streams (a stdlib-only
#     Python client: aggregate generated tok/s, p50/p99 time to first token).
#
# Everything printed goes to $OUT/bench.txt. Meant to finish within ~9 minutes; each step
# has a timeout and later steps are skipped when the budget runs out.
# On the device:  bash devbin/bench-full.sh   (carry devbin/, or at least devbin/cli-gpu/)
set -u -o pipefail
R=${REDLINE:-devbin/cli-gpu/redline}
OUT=${OUT:-/tmp/bench-out}
BUDGET_S=${BUDGET_S:-540}
DIR=${BENCH_DIR:-/tmp/rlbench}
PORT=${PORT:-8093}
mkdir -p "$OUT" "$DIR"
exec > >(tee -a "$OUT/bench.txt") 2>&1
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/rlcache}
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
say() { echo; echo "=== [$(elapsed)s] $*"; }
left() { echo $(( BUDGET_S - $(elapsed) )); }
# run_for SECONDS CMD...: runs CMD with a timeout capped by the remaining budget.
# LAST_RC: its exit status (124: timed out; 0 also when skipped).
LAST_RC=0
run_for() {
    local want=$1; shift
    local l; l=$(left)
    LAST_RC=0
    if [ "$l" -lt 20 ]; then echo "(skipped, budget spent: $*)"; return 0; fi
    [ "$want" -gt "$l" ] && want=$l
    timeout --signal=INT --kill-after=10 "$want" "$@" || { LAST_RC=$?; echo "(exit $LAST_RC after at most ${want}s: $*)"; }
}

chmod +x "$R" 2>/dev/null || true
say "redline: $R"; "$R" --version
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv || true
nproc; free -g | head -2; df -h /tmp | tail -1

# The first model also gets the depth run and the serve test. BENCH_MODELS="shape type;…",
# PARTIAL_MODEL and PARTIAL_LIMIT override these for a quick rehearsal on small shapes.
MODELS=(
    "qwen2.5-32b Q4_K_M"
    "qwen2.5-32b IQ4_XS"
    "qwen2.5-32b Q4_0"
    "qwen3.5-27b Q4_K_M"
    "qwen3.5-27b IQ4_XS"
    "qwen3.5-27b Q4_0"
)
if [ -n "${BENCH_MODELS:-}" ]; then IFS=';' read -r -a MODELS <<< "$BENCH_MODELS"; fi
PARTIAL_MODEL=${PARTIAL_MODEL:-qwen2.5-32b IQ4_XS}
PARTIAL_LIMIT=${PARTIAL_LIMIT:-16G}
file_of() { set -- $1; echo "$DIR/$1-$2.gguf"; }
synth() { # "shape type": writes the file, prints one line
    set -- $1
    local t=$(date +%s)
    "$R" synth --shape "$1" --type "$2" -o "$DIR/$1-$2.gguf" 2>&1 | tr '\r' '\n' | grep -E '^(wrote|qwen|error|Error)' || true
    echo "  synth $1 $2: $(( $(date +%s) - t ))s"
}

# --- serve load test ------------------------------------------------------------------------
cat > "$DIR/serve_load.py" <<'PY'
"""Streaming load test against redline serve: C concurrent clients (stdlib only). Greedy unless
BENCH_TEMPERATURE is set (then the server's default top-k 40, top-p 0.95, min-p 0.05)."""
import http.client, json, os, sys, threading, time

port, levels, max_tokens, reqs = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
PROMPT = ("Write a long story about a lighthouse keeper who finds a map in a bottle, "
          "and the journey across the northern sea that follows. ") * 3

def one(out):
    t0 = time.perf_counter()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        body = json.dumps({"model": "bench", "prompt": PROMPT, "max_tokens": max_tokens,
                           "temperature": float(os.environ.get("BENCH_TEMPERATURE", "0")),
                           "stream": True, "ignore_eos": True,
                           "stream_options": {"include_usage": True}})
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            out.append(("error", f"HTTP {r.status}: {r.read()[:200]!r}"))
            return
        ttft, n, usage, times = None, 0, None, []
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                if ch.get("text"):
                    now = time.perf_counter()
                    if ttft is None:
                        ttft = now - t0
                    n += 1
                    times.append(now)
        toks = usage["completion_tokens"] if usage else n
        out.append(("ok", ttft if ttft is not None else time.perf_counter() - t0, toks, t0,
                    time.perf_counter(), times))
    except Exception as e:  # a failed request is counted, not fatal
        out.append(("error", repr(e)))

def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(p / 100 * len(xs) + 0.5)) - 1))]

# aggregate tok/s: every generated token over the wall time (prefills and first tokens included);
# per-stream tok/s: a request's tokens over its time after the first token, averaged; aggregate
# decode: streams x per-stream (issue 6's "8 streams >= 6x one stream" compares this column);
# all-streams decode: the tokens that arrive while every one of the C streams is between its
# first and last token, over that time (no prompt is being prefilled then, so this is the
# batched decode step's rate as the clients see it)
def all_decoding(ok, c):
    edges = sorted([(o[5][0], 1) for o in ok if len(o[5]) > 1] + [(o[5][-1], -1) for o in ok if len(o[5]) > 1])
    spans, live, since = [], 0, None
    for t, d in edges:
        live += d
        if live == c and d == 1:
            since = t
        elif since is not None and live < c:
            spans.append((since, t))
            since = None
    secs = sum(b - a for a, b in spans)
    toks = sum(1 for o in ok for t in o[5] for a, b in spans if a < t <= b)
    return toks / secs if secs > 0 else float("nan"), secs

print(f"| streams | requests | errors | generated tokens | wall s | aggregate tok/s | per-stream tok/s | aggregate decode tok/s | all-streams decode tok/s (s) | TTFT p50 ms | TTFT p99 ms |")
print(f"| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for c in [int(x) for x in levels.split(",")]:
    out = []
    def client():
        for _ in range(reqs):
            one(out)
    ts = [threading.Thread(target=client) for _ in range(c)]
    start = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - start
    ok = [o for o in out if o[0] == "ok"]
    errs = [o for o in out if o[0] != "ok"]
    toks = sum(o[2] for o in ok)
    ttft = [o[1] * 1e3 for o in ok] or [float("nan")]
    per_stream = sum(o[2] / max(o[4] - o[3] - o[1], 1e-9) for o in ok) / max(len(ok), 1)
    steady, steady_s = all_decoding(ok, c)
    print(f"| {c} | {len(out)} | {len(errs)} | {toks} | {wall:.1f} | {toks / wall:.1f} | "
          f"{per_stream:.1f} | {c * per_stream:.1f} | {steady:.1f} ({steady_s:.1f}) | {pct(ttft, 50):.0f} | "
          f"{pct(ttft, 99):.0f} |", flush=True)
    for e in errs[:3]:
        print("  error:", e[1])
PY

serve_test() { # model file
    local f=$1
    say "serve load test on $(basename "$f"): --parallel 32, 2048 tokens per slot"
    "$R" serve -m "$f" --device cuda --parallel 32 -c 65536 --port "$PORT" --host 127.0.0.1 --shutdown-grace 1 \
        > "$OUT/serve.log" 2>&1 &
    local pid=$!
    local up=0
    for _ in $(seq 1 240); do
        if python3 -c "import http.client,sys; c=http.client.HTTPConnection('127.0.0.1',$PORT,timeout=2); c.request('GET','/health'); sys.exit(0 if c.getresponse().status==200 else 1)" 2>/dev/null; then
            up=1; break
        fi
        kill -0 $pid 2>/dev/null || break
        sleep 0.5
    done
    grep -E "offloaded|GPU memory|ledger|fits|loaded|context|warn|error|Error" "$OUT/serve.log" | head -40
    if [ $up = 1 ]; then
        # Warm-up (first-use work), then 1, 8, 32 concurrent streams of 64 generated tokens.
        run_for 60 python3 "$DIR/serve_load.py" "$PORT" 1 16 1 > /dev/null
        run_for 200 python3 "$DIR/serve_load.py" "$PORT" 1,8,32 64 2
    else
        echo "server did not come up:"; tail -20 "$OUT/serve.log"
    fi
    kill -TERM $pid 2>/dev/null; sleep 2; kill -KILL $pid 2>/dev/null
    wait $pid 2>/dev/null
}

# --- the run --------------------------------------------------------------------------------
# Warm-up while the first file is written: every kernel compiled (NVRTC, cached under
# $XDG_CACHE_HOME) and cuBLAS loaded on a 2-layer file, so no timed run pays for it; its
# per-repetition lines also show early whether decode and prefill work at all.
say "warm-up on a 2-layer ${MODELS[0]} (kernels compiled and cached) while ${MODELS[0]} is written"
set -- ${MODELS[0]}
"$R" synth --shape "$1" --type "$2" --layers 2 -o "$DIR/warm.gguf" 2>&1 | grep -E '^(wrote|error|Error)' || true
synth "${MODELS[0]}" > "$OUT/synth-0.log" 2>&1 &
first_pid=$!
run_for 120 "$R" bench -m "$DIR/warm.gguf" --device cuda -p 512 -n 16 -r 1
# A prefill that does not finish on 2 layers will not on 64: measure decode only then.
PP=(-p 512)
if [ "$LAST_RC" = 124 ] || [ "$LAST_RC" = 130 ]; then
    echo "warm-up timed out (see its per-repetition lines above): the runs below skip pp (-p 0)"
    PP=(-p 0)
fi
rm -f "$DIR/warm.gguf"
wait "$first_pid"
cat "$OUT/synth-0.log"
for i in "${!MODELS[@]}"; do
    m=${MODELS[$i]}
    f=$(file_of "$m")
    next_pid=""
    if [ $((i + 1)) -lt ${#MODELS[@]} ] && [ "$(left)" -gt 60 ]; then
        synth "${MODELS[$((i + 1))]}" > "$OUT/synth-$((i + 1)).log" 2>&1 &
        next_pid=$!
    fi
    if [ -f "$f" ]; then
        say "bench $m"
        run_for 150 "$R" bench -m "$f" --device cuda "${PP[@]}" -n 128 -r 3
        if [ "$i" = 0 ]; then
            say "bench $m at depth 4096"
            run_for 150 "$R" bench -m "$f" --device cuda "${PP[@]}" -n 128 -r 3 -d 4096
            serve_test "$f"
        fi
        if [ "$m" = "$PARTIAL_MODEL" ]; then
            say "partial offload: $m with --vram-limit $PARTIAL_LIMIT (an emulated smaller card)"
            run_for 150 "$R" bench -m "$f" --device cuda --vram-limit "$PARTIAL_LIMIT" -p 128 -n 32 -r 1
        fi
        rm -f "$f"
    else
        say "no file for $m (synth skipped or failed)"
    fi
    if [ -n "$next_pid" ]; then
        wait "$next_pid"
        cat "$OUT/synth-$((i + 1)).log"
    fi
done
rm -rf "$DIR"
say "done in $(elapsed)s"
