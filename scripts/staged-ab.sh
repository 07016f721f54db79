#!/usr/bin/env bash
# Device window for the staged decode fusions (crates/cuda/src/backend/mod.rs StagedFusions; all
# off by default): their GPU tests, then tg A/Bs on the full-size synthetic models, each variant
# by its environment variable with the same binary, rounds alternating; per-op profiles with all
# of them on; the verify-cost table (issue 8). Needs devpk/pack.tar.xz built here with the test binaries:
#
#   bash scripts/device-tests.sh && bash scripts/device-pack.sh
#   run(command="STAGE=t1 bash scripts/staged-ab.sh", carry=["devpk"]), then STAGE=t2, ab, rest, serve
#   (each within one call's 600 s; the synthetic files, written during t1, stay in /tmp while
#   the machine is warm, and are written again on a fresh one)
#
# Prints one line per run (model, variant, the bench table's tok/s and roofline columns);
# profiles go to $OUT.
set -u -o pipefail
cd "$(dirname "$0")/.."
STAGE=${STAGE:-all}
. scripts/device-lib.sh
# every variant sets all five switches (four are on by default since this A/B, q8k off)
v() { echo "REDLINE_DN_PDL=$1 REDLINE_FUSED_GATES=$2 REDLINE_FUSED_NORM_Q8=$3 REDLINE_FUSED_ATTN_Q8=$4 REDLINE_FUSED_Q8K=$5"; }
NONE=$(v 0 0 0 0 0)
ALL=$(v 1 1 1 1 1)
if [ "$STAGE" = all ] || [ "$STAGE" = t1 ]; then
    # the staged paths against the defaults, bit for bit (these tests set the fusions
    # themselves), and the default paths (their launches changed too)
    timeout 150 devbin/t_backend_conformance --ignored --test-threads 1 2>&1 | grep -E "^test |result|differ|panicked" | head -14
    timeout 200 devbin/t_gpu_decode --include-ignored --test-threads 1 --nocapture 2>&1 | grep -E "^test .*FAILED|result|differ|panicked|staged calls" | head -14
    echo "== t1 done $(el)"
fi
if [ "$STAGE" = all ] || [ "$STAGE" = t2 ]; then
    # the suites with every staged fusion on
    env $ALL timeout 200 devbin/t_gpu_decode --include-ignored --test-threads 1 2>&1 | grep -E "FAILED|result|panicked" | head -8
    env $ALL timeout 150 devbin/t_gpu_deltanet --include-ignored --test-threads 1 2>&1 | grep -E "FAILED|result|panicked" | head -6
    env $ALL timeout 150 devbin/t_backend_models --include-ignored --test-threads 1 2>&1 | grep -E "FAILED|result|panicked" | head -6
    echo "== t2 done $(el)"
fi
wait $SP
echo "== synth done $(el)"
case $STAGE in t1 | t2) exit 0 ;; esac
b() { # model variant env... ; then bench args after --
    local m=$1 v=$2
    shift 2
    local e=()
    while [ "$1" != -- ]; do e+=("$1"); shift; done
    shift
    echo "$m $v: $(env "${e[@]}" timeout 90 $R bench --device cuda -m /tmp/$m.gguf -p 0 "$@" 2>&1 | grep -E '^\| qwen' | cut -d'|' -f8-)"
}
[ "$STAGE" = all ] || [ "$STAGE" = ab ] && for r in ${ROUNDS:-1 2}; do
    b m27 none $NONE -- -n 128 -r 2
    b m27 dn_pdl $(v 1 0 0 0 0) -- -n 128 -r 2
    b m27 +gates $(v 1 1 0 0 0) -- -n 128 -r 2
    b m27 +norm_q8 $(v 1 1 1 0 0) -- -n 128 -r 2
    b m27 all $ALL -- -n 128 -r 2
    b m32 none $NONE -- -n 128 -r 2
    b m32 attn_q8 $(v 0 0 0 1 0) -- -n 128 -r 2
    b m27 x8-none $NONE -- -n 64 -r 2 --parallel 8
    b m27 x8-all $ALL -- -n 64 -r 2 --parallel 8
    b m32 x8-none $NONE -- -n 64 -r 2 --parallel 8
    b m32 x8-q8k $(v 0 0 0 0 1) -- -n 64 -r 2 --parallel 8
    b m32 x8-all $ALL -- -n 64 -r 2 --parallel 8
done
echo "== A/B done $(el)"
[ "$STAGE" = ab ] && exit 0
if [ "$STAGE" = serve ]; then
    # issue 6's serve rows at 1 and 8 streams, default and staged
    serve_rows none 8 1,8 $NONE
    serve_rows all 8 1,8 $ALL
    exit 0
fi
# issue 8's verify-cost table: passes of k tokens against one decode step, default and staged
for v in none all; do
    case $v in none) e=($NONE) ;; all) e=($ALL) ;; esac
    echo "verify m27 $v:"
    env "${e[@]}" timeout 120 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,3,4,8 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)'
done
mkdir -p "${OUT:-/tmp/out}"
for m in m32 m27; do
    for p in 1 8; do
        env $ALL REDLINE_PROFILE_OPS=1 timeout 90 $R bench --device cuda -m /tmp/$m.gguf -p 0 -n 16 -r 1 --parallel $p >"${OUT:-/tmp/out}/prof_${m}_$p.txt" 2>&1
    done
done
echo "== done $(el)"
