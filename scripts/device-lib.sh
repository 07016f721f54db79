# Shared by the device-window scripts (staged-ab.sh, mmv2-ab.sh): sourced from the repository
# root. Unpacks devpk/pack.tar.xz unless devbin/ is there, points the kernel cache at the
# packed one, starts writing the two synthetic Q4_K_M files in the background (SP: its pid; they
# stay in /tmp while the machine is warm; NO_SYNTH=1: not), and defines el (seconds since start) and serve_rows.
[ -d devbin ] || tar xJf devpk/pack.tar.xz
export XDG_CACHE_HOME=$PWD/devbin/cache
R=devbin/redline
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0))s]"; }
[ -n "${NO_SYNTH:-}" ] || [ -e /tmp/synth.done ] || ($R synth --shape qwen2.5-32b --type Q4_K_M -o /tmp/m32.gguf >/tmp/s32.log 2>&1 &&
    touch /tmp/m32.done && $R synth --shape qwen3.5-27b --type Q4_K_M -o /tmp/m27.gguf >/tmp/s27.log 2>&1 &&
    touch /tmp/synth.done) &
SP=$!
# wait_m32: until the 32B file is written (stages that need only it start before the 27B's).
wait_m32() { while [ ! -e /tmp/m32.done ] && [ ! -e /tmp/synth.done ] && kill -0 $SP 2>/dev/null; do sleep 1; done; }

# serve_rows LABEL SLOTS STREAMS [VAR=value...]: issue 6's serve rows on the 32B (bench-full.sh's
# stdlib client, TOKENS (64) tokens, 2 requests per stream, after a warm-up), the server started
# with SLOTS slots and the given environment.
serve_rows() {
    local label=$1 par=$2 streams=$3
    shift 3
    [ -e /tmp/serve_load.py ] ||
        sed -n "/^cat > \"\$DIR\/serve_load.py\" <<'PY'/,/^PY\$/p" scripts/bench-full.sh | sed '1d;$d' >/tmp/serve_load.py
    env X=1 "$@" $R serve -m /tmp/m32.gguf --device cuda --parallel "$par" -c $((${CTX_PER_SLOT:-2048} * par)) --port 8093 \
        --shutdown-grace 1 >"/tmp/serve_$label.log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 160); do
        python3 -c "import http.client,sys; c=http.client.HTTPConnection('127.0.0.1',8093,timeout=2); c.request('GET','/health'); sys.exit(0 if c.getresponse().status==200 else 1)" 2>/dev/null && break
        sleep 0.5
    done
    echo "serve m32 $label (--parallel $par):"
    timeout 60 python3 /tmp/serve_load.py 8093 1 16 1 >/dev/null
    timeout 300 python3 /tmp/serve_load.py 8093 "$streams" "${TOKENS:-64}" 2
    kill -TERM $pid
    sleep 2
    kill -KILL $pid 2>/dev/null
    wait $pid 2>/dev/null
}
