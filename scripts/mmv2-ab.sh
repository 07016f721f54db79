#!/usr/bin/env bash
# Device window for session 15's few-token product work (crates/cuda/src/mmv.rs: token-interleaved
# q8_K, the staged Q4_K kernel, the K split, one- and two-token Q4_K on mmv2). Needs
# devpk/pack.tar.xz built here with the test binary:
#
#   bash scripts/device-tests.sh gpu_mmq gpu_decode backend_conformance && bash scripts/device-pack.sh
#   (onerow also runs t_gpu_speculative when packed: PKG=redline bash scripts/device-tests.sh
#   gpu_speculative first)
#   run(command="STAGE=kernels bash scripts/mmv2-ab.sh", carry=["devpk"]), then STAGE=streams,
#   onerow, serve (each within one call's 600 s; the synthetic files stay in /tmp while the
#   machine is warm and are written again on a fresh one)
#
# kernels: gpu_mmq's checks against the CPU q8_K reference (every stage count and K split) and
#          the kernel timing sweep (stages x carveout x warps, K split) into $OUT/mmv2_timing.txt
# streams: 8 decode streams, variants by their switches with the same binary, rounds alternating
# onerow:  one-row tg128 with Q4_K products on mmv2 (REDLINE_MMV2_MIN=1) against the dp4a matvec,
#          two streams, and the verify-cost table (issue 8)
# spec:    t_gpu_speculative (greedy equality with speculation on mmv2 at every token count)
# serve:   issue 6's serve rows at 1, 8 and 32 streams (bench-full.sh's stdlib client); TOKENS=256 for
#          generations long enough that the decode phase dominates
# iq4xs:   the 27B at IQ4_XS, 4 and 8 streams, with REDLINE_MMV2_IQ4XS=1 against the matvec
# w2:      speculative tests, a verify pass's per-op profile
# convrows: the DeltaNet conv chain for several rows in one launch (REDLINE_FUSED_CONV_ROWS=1):
#          checks, then the 27B verify cost with and without it
# tiled:   the tiled q8_1 layout (REDLINE_Q8_1_TILED=1): checks, one row of both models and the
#          27B verify cost with and without it
# prefetch: the dp4a matvec's L2 prefetch distance (REDLINE_MV_PREFETCH=1..3) against none
#          (session 19: lost 7-10 %; the _pf kernels are removed, the stage is the record)
# xsmem:   x staged in shared memory in the 1-2-token Q4_K / Q6_K segment kernels (REDLINE_MV_XSMEM=1;
#          session 19's first version; since then two tokens only and on by default: XS0 below)
# xswide:  two-token x in shared memory beyond 48 KB (REDLINE_MV_XSMEM_WIDE=1)
# ncuattn: ncu per instruction of the one-row attention chain (fa_decode_fused_d128), 32B
# evict:   the matvec's weight loads evict-first in L2 (REDLINE_MV_LOAD=3) against the default
#          (session 19: no gain; the load mode is removed, the stage is the record)
# skip1:   a one-row 32B step op by op (profile and REDLINE_SKIP_OPS)
# ks8:     the mmv2 K split (REDLINE_MMV2_KSPLIT=2|4) at 8 streams
# s22:     the defaults of session 21 (direct kernels on): the matvec and speculative suites, one
#          row of both models against REDLINE_MV_DIRECT=0, 8 streams, and (SERVE=1) issue 6's rows
# direct:  the direct Q4_K / IQ4_XS one-/two-token kernels (REDLINE_MV_DIRECT=1, session 21):
#          checks, one row of both models (and the 32B IQ4_XS, /tmp/x32.gguf) at 1 / 2 / 4 rows
#          per warp against the staged kernels (rounds alternating), the per-op profile, two
#          streams and the 27B verify cost
# s32:     32 streams: batched decode at 8 / 16 / 32 rows, the profile at 32, the server's step log
# ncudir:  ncu on one-row 32B steps: the direct Q4_K kernel at 4 rows (gate/up) against the staged
#          one (mvm_q4_k_r4), to read a result of the direct stage (issue slots, occupancy, DRAM)
# s21:     the 8-warp default against the old choice, x staged at 8 warps, serve rows (SERVE=1)
# q4w:     8 warps per block for the Q4_K mmv2 launches (REDLINE_MMV2_Q4_WARPS=8)
# spread:  small mmv2 launches padded with shared memory to spread over the SMs (session 20)
# ncuxs:   ncu on the x-staged Q4_K down inside 8-row steps against the default staged kernel
# xs8b:    x staged from 16384 columns (then the default), Q6_K staged with it; sweep, 8 streams,
#          verify (the staged Q6_K kernels are removed since; the stage is the record)
# xs8:     x staged with the weights in the Q4_K mmv2 kernels (REDLINE_MMV2_XS=1) at 8 streams
# prof8:   an 8-row 32B step's per-op device time, Q6_K staged or not; the Q6_K kernel sweep
# q6s:     Q6_K mmv2 with cp.async staging (REDLINE_MMV2_Q6_STAGE) at 8 streams (session 20:
#          slower, removed; the stage is the record)
# roll:    the one-row attention kernel's loops rolled (session 20) against devbin/k_fa0
# suites:  the GPU test suites at HEAD (matvec with the prefetch kernels, conformance, decode,
#          speculative)
# ncu:     ncu's per-instruction stall samples of the one-token Q4_K / Q6_K segment kernels
# xt:      two-token Q6_K / Q4_K matvec one token at a time (built-in vs devbin/k_q6, devbin/k_prev)
#          and the multi-row attention preparation (REDLINE_FUSED_ATTN_ROWS=1)
# onerow2: one-row variants (REDLINE_MMV2_MIN=1, REDLINE_MMV2_SMALL with and without a K split)
# core:    the most in one window: checks, 8 streams (s15 / default), one row, verify cost
#          (default and exact mode), the 27B at 8 streams
# skip8:   the graph-mode cost of each op kind in an 8-row 32B step (REDLINE_SKIP_OPS)
# xj1:     (written, not run) x just in time in the direct kernels at one token too
# s32a:    session 32: s31a cut down (suite, verify A/B default / XG=1 / XG=2 / XG=2+DIRECT4)
# s33a:    written in session 32 (not run): the final rule as one binary, 27B and 32B verify A/B
# s33b:    session 33: a one-row 27B step op by op (profile and REDLINE_SKIP_OPS, groups of kinds)
# s33c:    session 33 (not run: its defaults changed, s33e ran instead): the direct Q6_K
#          kernels: suites, one row A/B, 27B profiles
# s33d:    session 33 (not run, s33e instead): the conv window before the PDL wait
# s33e:    session 33: s33c and s33d cut short
# s33f:    session 33: the 32B's Q6_K variants, the 27B's issue-4 rows with k_conv1
# s37a:    session 37: the f32 alpha / beta products in the conv's launch against their own:
#          the bit-for-bit tests, greedy text, one row, the 27B verify cost, a trace
# s41a:    next session: the fused attention chain's time before its loop under REDLINE_PDL_EARLY=7 / REDLINE_MV_STAGE=0
# s40b:    session 40: the fused decode attention's first chunks before the wait, A/B with the whole group; traces
# s40a:    next session: REDLINE_FA_WHOLE_GROUP_FROM (the whole query-head group in one decode block at depth)
# s39e:    session 39: default traces, 27B / 32B, the 32B at depth 4096
# s39d:    session 39: the 32B at depth 4096 under the decode attention's knobs
# s39c:    session 39: the default's verify cost and issue-4 rows (pp512, depth 4096)
# s39b:    session 39, second pack: the queue's two-level end count against queue off
# s39a:    session 39: the queue with nk ticket counters (REDLINE_MV_QUEUE_K) against queue off
# s38e:    session 38: s38c in two rounds, in the order of what matters most, for a window of ~250 s
# s38c:    session 38, one window for both: the queue products and the SwiGLU epilogue against the
#          old default (both off), each alone, the queue Q6_K kernels; suites, greedy text, rounds
#          (every variant names both switches, so it does not matter which default the pack has)
# s37b:    session 37: the same on 256-thread blocks, and the RoPE angle cache, both A/B
# s35g:    session 35: the shipped default at 8 streams against mask 0
# s35f:    session 35 (written, never run: the gating was taken out): the lookahead for one-row launches only: suites, greedy text, one row
#          and 8 streams of both models against the old defaults
# s35e:    session 35: the verify cost by lookahead bits; 8 streams at the new default
# s35d:    session 35: the new defaults against the old ones and 4 staged rows a warp:
#          suites, greedy text, one row of both models, the 27B's verify cost
# s35c:    session 35: the staged one-token Q4_K kernels (REDLINE_MV_STAGE) with and without
#          REDLINE_PDL_EARLY: suites, greedy text, one row of both models, 27B profile
# s35b:    session 35: REDLINE_PDL_EARLY (two kernels of lookahead) with and without
#          REDLINE_MV_PREFETCH: suites, greedy text, one row of both models
# s35a:    written in session 34, not run: REDLINE_MV_PREFETCH=1 (the direct kernels' warps ask
#          for their rows in one bulk L2 prefetch): suites, one row of both models, 27B profile
# s34d:    session 34: the 27B's per-op profile with the side-stream prefetch off / on; the
#          3-heads-a-block default against 8
# s34c:    session 34: REDLINE_FA_HEADS_PER_BLOCK=3 against the default, both models
# s34b:    session 34: REDLINE_L2_PREFETCH (the next products' weights toward L2): greedy
#          text off / on, one row of both models at 0 / 16 / 24 / 32 MiB
# s34a:    session 34: the 27B verify cost with REDLINE_MV_DIRECT_Q6K=all (after s33g)
# s33g:    session 33: decode blocks of fewer query heads (REDLINE_FA_HEADS_PER_BLOCK)
# s32b:    session 32: the size rule as default against REDLINE_MV_DIRECT_XG=0
# s31a:    session 31 (not run): the 3-4-token Q4_K direct kernels with x held a token group
#          at a time (REDLINE_MV_DIRECT_XG): suites, the four 27B shapes, verify cost A/B;
#          s31b (not run): ncu of the 4-token one in a verify pass
# s30a:    session 30: the review commit's product and speculative suites; s30b: ncu, the direct
#          Q4_K kernel against the staged mmv2 kernel at one token (27B); s30c (not run): the
#          three-token switch against 2-row verify passes
# s29a:    session 29: Q6_K few-token products on q8_1 x through the staged tensor-core kernel
#          (mmv2_q6_k_q81): checks, the 27B verify cost against REDLINE_MMV_Q6K=0, suites;
#          s29b: its tiled-x variant, verify costs, verify-pass profiles at 1 and 4 rows;
#          s29c: x just in time in the 3-4-token direct kernels against devbin/k_base, and
#          REDLINE_MV_L2PF=1 (both lost and were taken out again), suites; s29d: the final kernels;
#          s29e: three-token direct kernels (REDLINE_MV_DIRECT_N3=1) against the four-token ones
# s28a:    session 28: session 27's final default on the card, xj1, Q6_K mmv2 against dp4a at
#          the 27B's Q6_K shapes; s28b: one-row profiles with Q6_K on mmv2; s28c: issue 4's
#          table on all six models; s28d: the direct Q4_0 kernels against the staged ones, suites
# s27a-g:  session 27: few-token products of the 5120-row shapes (rows per warp, register caps,
#          the direct kernels at 3-4 tokens), Q6_K on mmv2 from one token in speculating runs:
#          checks, segment timing, the 27B verify cost per variant, one row of both models
# s26a-j:  session 26: attention in 8-row steps (profile, ncu), greedy picks and top-k candidates
#          made on the card, the recorded step cut after layer 2, the decode-kernel K/V store
#          (taken out), serve rows greedy and at temperature 0.8, the final binary
# s16:     session 16's product kernels against session 15's (REDLINE_KERNEL_DIR=devbin/k_s15):
#          gpu_mmq, then 8 streams (32B twice, 27B), 32 streams and one row of the 32B
set -u -o pipefail
cd "$(dirname "$0")/.."
STAGE=${STAGE:-kernels} # several: STAGE="s16 skip8"
. scripts/device-lib.sh
b() { # model, bench args...; variant env in ST
    local m=$1
    shift
    echo "== $m ${ST:-default} $*" >>"$OUT/err.txt"
    echo "$m ${ST:-default} $*: $(env ${ST:-X=1} timeout 100 $R bench --device cuda -m /tmp/$m.gguf -p 0 "$@" 2>>"$OUT/err.txt" | grep -E '^\| qwen' | cut -d'|' -f8-)"
}
# suite BIN [args...]: a GPU test binary's summary on one line (failures, the result line)
suite() {
    local bin=$1
    shift
    echo "$bin: $(timeout 200 devbin/$bin --test-threads 1 "$@" 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|differs" | head -4 | tr '\n' ' ')"
}
# vb "VAR=value ..." K R: the 27B's verify cost (ms and x a step per pass) under that environment
# (VB_M=m32: the 32B's)
vb() {
    echo "${VB_M:+$VB_M }verify $1: $(env $1 timeout 100 $R verify-bench -m "/tmp/${VB_M:-m27}.gguf" --device cuda -k "$2" -d 256 -r "$3" 2>&1 | grep -E '^\| (decode|verify)' | tr -s ' ' | cut -d'|' -f3,4 | tr '\n' ' ')"
}
# greedy M VARIANT...: md5 of M's greedy text (32 tokens) under each environment (the same
# md5 = the same tokens)
greedy() {
    local m=$1 v t
    shift
    for v in "$@"; do
        t=$(env $v timeout 90 $R run -m /tmp/$m.gguf --device cuda -p 'The quick brown fox' -n 32 --temp 0 2>>"$OUT/err.txt" | tr -d '\0')
        echo "$m $v: $(echo "$t" | md5sum | cut -c1-12)"
    done
}
# trace_run LABEL M VAR=value...: one traced replay (REDLINE_TRACE, the 40th; TSTEP) of M's decode
# under that environment (TARGS: more bench arguments, e.g. -d 4096): the bench row, $OUT/LABEL.txt (scripts/trace-summary.py, launches
# TSKIP.. TSKIP + TSEQ) and $OUT/LABEL.trace.xz
trace_run() {
    local l=$1 m=$2
    shift 2
    env "$@" REDLINE_TRACE=$OUT/$l.trace REDLINE_TRACE_STEP=${TSTEP:-40} timeout 120 $R bench --device cuda \
        -m /tmp/$m.gguf -p 0 -n 64 -r 1 ${TARGS:-} 2>>"$OUT/err.txt" | grep -E '^\| qwen' | cut -d'|' -f8-
    python3 scripts/trace-summary.py $OUT/$l.trace --skip ${TSKIP:-200} --seq ${TSEQ:-40} >$OUT/$l.txt 2>&1
    xz -T0 -6 $OUT/$l.trace
    echo "$l: $(head -1 $OUT/$l.txt)"
}
for stage in $STAGE; do
case $stage in
kernels)
    timeout 150 devbin/t_gpu_mmq --test-threads 1 2>&1 | grep -E "^test |result|panicked|FAIL" | head -16
    echo "== checks $(el)"
    RUST_BACKTRACE=1 timeout 250 devbin/t_gpu_mmq --ignored --test-threads 1 --nocapture mmv2_timing >"$OUT/mmv2_timing.txt" 2>&1
    grep -E "^ *q[46]_K|mmv2 q|panicked" "$OUT/mmv2_timing.txt" | head -40
    echo "== timing $(el)"
    ;;
streams)
    wait $SP
    for r in ${ROUNDS:-1 2}; do
        for v in "REDLINE_MMV2_STAGE=0" "X=1" "REDLINE_MMV2_KSPLIT=2" "REDLINE_MMV2_STAGE=3 REDLINE_MMV2_CARVEOUT=50"; do
            ST=$v b m32 -n 64 -r 2 --parallel 8
        done
        echo "round $r $(el)"
    done
    for v in "REDLINE_MMV2_STAGE=0" "X=1" "REDLINE_MMV2_KSPLIT=2"; do ST=$v b m27 -n 64 -r 2 --parallel 8; done
    echo "== streams $(el)"
    ;;
onerow)
    wait $SP
    for m in m32 m27; do
        b $m -n 128 -r 2
        ST="REDLINE_MMV2_MIN=1" b $m -n 128 -r 2
        ST="REDLINE_MMV2_MIN=1 REDLINE_FUSED_Q8K=1" b $m -n 128 -r 2
        ST="REDLINE_MMV2_MIN=1 REDLINE_MMV2_MIN_Q6K=1" b $m -n 128 -r 2
        # only the small one-token products (o / out-projections, the 32B's QKV) on mmv2
        ST="REDLINE_MMV2_SMALL=8192" b $m -n 128 -r 2
        ST="REDLINE_MMV2_SMALL=8192 REDLINE_MMV2_KSPLIT=2" b $m -n 128 -r 2
        ST="REDLINE_MMV2_SMALL=8192 REDLINE_MMV2_KSPLIT=4" b $m -n 128 -r 2
        b $m -n 64 -r 2 --parallel 2
        ST="REDLINE_MMV2_MIN=2" b $m -n 64 -r 2 --parallel 2
    done
    echo "== one row $(el)"
    for v in X=1 "REDLINE_MMV2_MIN=1" "REDLINE_MMV2_MIN=1 REDLINE_MMV2_MIN_Q6K=1"; do
        echo "verify $v:"
        env $v timeout 150 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,3,4,8 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | head -8
    done
    echo "== verify $(el)"
    ;;
spec)
    # speculation on mmv2 at every token count: greedy equality and full acceptance (self-draft)
    [ -x devbin/t_gpu_speculative ] && timeout 200 devbin/t_gpu_speculative --ignored --test-threads 1 2>&1 |
        grep -E "^test |result|panicked|self-draft" | head -12
    echo "== speculative $(el)"
    ;;
s16)
    # session 16's kernels (the _emu split: 60-register staged Q4_K, Q6_K decode, mmq) against
    # f6cc4dc's mmv.cu / mmq.cu through REDLINE_KERNEL_DIR (devbin/k_s15, cache prefilled by
    # device-pack.sh); checks first
    timeout 150 devbin/t_gpu_mmq --test-threads 1 2>&1 | grep -E "^test |result|panicked|FAIL" | head -16
    echo "== checks $(el)"
    CHECKED=1
    wait $SP
    OLD="REDLINE_KERNEL_DIR=$PWD/devbin/k_s15"
    for r in 1 2; do
        for v in "X=1" "$OLD"; do ST=$v b m32 -n 64 -r 2 --parallel 8; done
    done
    for v in "X=1" "$OLD"; do ST=$v b m27 -n 64 -r 2 --parallel 8; done
    for v in "X=1" "$OLD"; do ST=$v b m32 -n 32 -r 1 --parallel 32; done
    for v in "X=1" "$OLD"; do ST=$v b m32 -n 128 -r 2; done
    echo "== s16 $(el)"
    ;;
iq4xs)
    # IQ4_XS 3..8-token products on mmv2_iq4_xs (REDLINE_MMV2_IQ4XS=1) against the dp4a matvec
    [ -e /tmp/x27.gguf ] || $R synth --shape qwen3.5-27b --type IQ4_XS -o /tmp/x27.gguf >/tmp/sx27.log 2>&1
    timeout 150 devbin/t_gpu_mmq --test-threads 1 mmv2_ 2>&1 | grep -E "^test |result|panicked|FAIL" | head -8
    for v in "X=1" "REDLINE_MMV2_IQ4XS=1" "X=1" "REDLINE_MMV2_IQ4XS=1"; do ST=$v b x27 -n 64 -r 2 --parallel 8; done
    for v in "X=1" "REDLINE_MMV2_IQ4XS=1"; do ST=$v b x27 -n 64 -r 2 --parallel 4; done
    echo "== iq4xs $(el)"
    ;;
w2)
    # session 17's second window: the speculative tests (the exact mode's check on given tokens),
    # a verify pass's per-op profile (k = 1, 2, 4: where k = 2's extra time goes), one-row variants
    timeout 150 devbin/t_gpu_speculative --ignored --test-threads 1 --nocapture 2>&1 |
        grep -E "^test |result|panicked|self-draft|row [0-9]|distinct|differs" | head -30
    echo "== speculative $(el)"
    wait $SP
    REDLINE_PROFILE_OPS=1 timeout 150 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,4 -d 256 -r 3 >"$OUT/verify_profile.txt" 2>&1
    grep -E '^\| (decode|verify)' "$OUT/verify_profile.txt"
    echo "== verify profile $(el)"
    ;;
convrows)
    # session 17's mo_conv1d_qkv_rows (REDLINE_FUSED_CONV_ROWS=1): checks (bit-equal to the separate
    # ops), then the 27B verify cost with and without it
    timeout 150 devbin/t_backend_conformance --ignored --test-threads 1 conv1d_qkv 2>&1 | grep -E "^test |result|panicked" | head -6
    timeout 200 devbin/t_gpu_decode --test-threads 1 staged_fusions 2>&1 | grep -E "^test |result|panicked" | head -6
    echo "== conv rows checks $(el)"
    wait $SP
    for v in X=1 REDLINE_FUSED_CONV_ROWS=1 X=1 REDLINE_FUSED_CONV_ROWS=1; do
        echo "verify $v:"
        env $v timeout 150 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,3,4 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | head -8
    done
    echo "== conv rows $(el)"
    ;;
tiled)
    # session 18's tiled q8_1 layout (REDLINE_Q8_1_TILED=1): checks (the matvec against the CPU
    # reference, segments, decode logits bit-equal to the natural layout), then one row and the
    # 27B verify cost with and without it, alternating
    timeout 200 devbin/t_gpu_matvec --test-threads 1 2>&1 | grep -E "^test |result|panicked|failures|tiled q8_1 true" | head -12
    timeout 200 devbin/t_gpu_decode --test-threads 1 q8_1_tiled 2>&1 | grep -E "^test |result|panicked|differ" | head -6
    echo "== tiled checks $(el)"
    wait $SP
    for r in 1 2; do
        for m in m32 m27; do
            for v in X=1 REDLINE_Q8_1_TILED=1; do ST=$v b $m -n 128 -r 2; done
        done
        echo "round $r $(el)"
    done
    for v in X=1 REDLINE_Q8_1_TILED=1; do
        echo "verify $v:"
        env $v timeout 150 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,3,4 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | head -8
    done
    echo "== tiled $(el)"
    ;;
prefetch)
    # session 18's L2 prefetch in the dp4a matvec (REDLINE_MV_PREFETCH=1..3 groups past the next
    # one; ncu showed the kernel latency-bound, one group per warp in flight): one row of both
    # models, two streams of the 27B and its verify cost, rounds alternating (ROUNDS, PFS)
    [ -n "${CHECKED:-}" ] || REDLINE_MV_PREFETCH=3 timeout 200 devbin/t_gpu_matvec --test-threads 1 2>&1 | grep -E "^test |result|panicked|failures" | head -6
    wait $SP
    for r in ${ROUNDS:-1 2}; do
        for v in X=1 ${PFS:-REDLINE_MV_PREFETCH=1 REDLINE_MV_PREFETCH=2 REDLINE_MV_PREFETCH=3}; do
            for m in m32 m27; do ST=$v b $m -n 128 -r 2; done
            ST=$v b m27 -n 64 -r 2 --parallel 2
            echo "verify $v:"
            env $v timeout 100 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2 -d 256 -r 5 2>&1 | grep -E '^\| (decode|verify)' | head -4
        done
        echo "round $r $(el)"
    done
    echo "== prefetch $(el)"
    ;;
xt)
    # session 18's two-token matvec with one token's x in registers at a time (Q6_K and Q4_K at 4
    # rows per warp: one wave of blocks for the 5120-row products) and the multi-row attention
    # preparation in one launch (REDLINE_FUSED_ATTN_ROWS=1): checks, then the 27B verify cost,
    # built-in (both) against devbin/k_q6 (Q6_K only) and devbin/k_prev (before), with and
    # without attn rows; the tiled q8_1 layout and the multi-row conv chain on in all of them;
    # then two streams and the 27B at 8 streams
    timeout 200 devbin/t_gpu_matvec --test-threads 1 2>&1 | grep -E "^test |result|panicked|failures" | head -12
    timeout 200 devbin/t_gpu_decode --test-threads 1 q8_1_tiled staged_fusions 2>&1 | grep -E "^test |result|panicked|differ|staged calls" | head -8
    timeout 100 devbin/t_backend_conformance --ignored --test-threads 1 attention 2>&1 | grep -E "^test |result|panicked" | head -8
    echo "== xt checks $(el)"
    wait $SP
    export REDLINE_Q8_1_TILED=1 REDLINE_FUSED_CONV_ROWS=1
    for r in 1 2; do
        for v in X=1 REDLINE_FUSED_ATTN_ROWS=1 REDLINE_KERNEL_DIR=$PWD/devbin/k_q6 REDLINE_KERNEL_DIR=$PWD/devbin/k_prev; do
            echo "verify $v:"
            env $v timeout 150 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,3,4 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | head -8
        done
        echo "round $r $(el)"
    done
    for v in X=1 REDLINE_KERNEL_DIR=$PWD/devbin/k_prev; do
        for m in m32 m27; do ST="$v" b $m -n 64 -r 2 --parallel 2; done
    done
    for v in X=1 REDLINE_FUSED_ATTN_ROWS=1; do ST="$v" b m27 -n 64 -r 2 --parallel 8; done
    unset REDLINE_Q8_1_TILED REDLINE_FUSED_CONV_ROWS
    echo "== xt $(el)"
    ;;
onerow2)
    wait $SP
    for m in m32 m27; do
        for v in X=1 "REDLINE_MMV2_MIN=1" "REDLINE_MMV2_SMALL=8192" "REDLINE_MMV2_SMALL=8192 REDLINE_MMV2_KSPLIT=2"; do
            ST=$v b $m -n 128 -r 2
        done
    done
    echo "== one row $(el)"
    ;;
core)
    # one window for the most: every kernel check, 8 streams of the 32B (session 15's kernels,
    # this session's default), one row (the 6x ratio), verify cost default vs exact mode
    timeout 150 devbin/t_gpu_mmq --test-threads 1 2>&1 | grep -E "^test |result|panicked|FAIL" | head -16
    echo "== checks $(el)"
    wait $SP
    for v in "X=1" "REDLINE_KERNEL_DIR=$PWD/devbin/k_s15" "X=1"; do
        ST=$v b m32 -n 64 -r 2 --parallel 8
    done
    b m32 -n 128 -r 2
    echo "== 32B $(el)"
    for v in X=1 "REDLINE_MMV2_MIN=1 REDLINE_MMV2_MIN_Q6K=1"; do
        echo "verify $v:"
        env $v timeout 150 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,3,4 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | head -8
    done
    echo "== verify $(el)"
    ST=X=1 b m27 -n 64 -r 2 --parallel 8
    b m27 -n 128 -r 2
    echo "== core $(el)"
    ;;
skip8)
    # graph-mode cost of each op kind in an 8-row step of the 32B (REDLINE_SKIP_OPS: the step
    # without it; outputs wrong), for issue 6's 6x: which non-product ops an 8-row step pays for
    wait $SP
    for s in X attention rope_qk rms_norm swiglu add matmul matmul_many matmul_add; do
        ST="REDLINE_SKIP_OPS=$s" b m32 -n 32 -r 2 --parallel 8
    done
    echo "== skip8 $(el)"
    ;;
serve)
    wait $SP
    for par in ${PARS:-8 32}; do serve_rows "p$par" "$par" "${STREAMS:-1,8,32}"; done
    ;;
xsmem)
    # x staged in shared memory in the one- and two-token Q4_K / Q6_K segment kernels
    # (REDLINE_MV_XSMEM=1, the mvm_*_xs kernels): checks, then one row of both models, two
    # streams and the 27B verify cost, rounds alternating
    [ -n "${CHECKED:-}" ] || REDLINE_MV_XSMEM=1 timeout 200 devbin/t_gpu_matvec --test-threads 1 2>&1 | grep -E "^test |result|panicked|failures" | head -6
    [ -n "${CHECKED:-}" ] || REDLINE_MV_XSMEM=1 timeout 200 devbin/t_gpu_decode --test-threads 1 q8_1_tiled staged_fusions 2>&1 | grep -E "^test |result|panicked|differ" | head -6
    echo "== xsmem checks $(el)"
    wait $SP
    for r in ${ROUNDS:-1 2}; do
        for v in X=1 ${XS0:-REDLINE_MV_XSMEM=1}; do
            for m in m32 m27; do ST=$v b $m -n 128 -r 2; done
            ST=$v b m27 -n 64 -r 2 --parallel 2
            echo "verify $v:"
            env $v timeout 100 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,3 -d 256 -r 5 2>&1 | grep -E '^\| (decode|verify)' | head -4
        done
        echo "round $r $(el)"
    done
    echo "== xsmem $(el)"
    ;;
ks8)
    # the mmv2 K split (REDLINE_MMV2_KSPLIT, launches under 600 tiles: the 5120-row down / o
    # projections) at 8 streams: ncu on the H200 showed the 32B's 8-row down projection at 0.4
    # waves of blocks, 18 % occupancy, 29 % of DRAM bandwidth
    wait $SP
    for v in X=1 REDLINE_MMV2_KSPLIT=2 REDLINE_MMV2_KSPLIT=4 X=1 REDLINE_MMV2_KSPLIT=2; do ST=$v b m32 -n 64 -r 2 --parallel 8; done
    for v in X=1 REDLINE_MMV2_KSPLIT=2; do ST=$v b m27 -n 64 -r 2 --parallel 8; done
    echo "== ks8 $(el)"
    ;;
xswide)
    # two-token x in shared memory beyond 48 KB (REDLINE_MV_XSMEM_WIDE=1: the 17408/27648-wide
    # down projections, where the blocks per SM stay): checks with it, then two streams of both
    # models and the 27B verify cost, rounds alternating
    REDLINE_MV_XSMEM_WIDE=1 timeout 200 devbin/t_gpu_decode --test-threads 1 q8_1_tiled staged_fusions 2>&1 | grep -E "^test |result|panicked|differ" | head -6
    REDLINE_MV_XSMEM_WIDE=1 timeout 200 devbin/t_gpu_speculative --ignored --test-threads 1 2>&1 | grep -E "^test result|panicked|FAILED" | head -6
    echo "== xswide checks $(el)"
    wait $SP
    for r in ${ROUNDS:-1 2}; do
        for v in X=1 REDLINE_MV_XSMEM_WIDE=1; do
            for m in m32 m27; do ST=$v b $m -n 64 -r 2 --parallel 2; done
            echo "verify $v: $(env $v timeout 60 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2 -d 256 -r 5 2>&1 | grep -E '^\| (decode|verify k=2)' | tr '\n' ' ')"
        done
        echo "round $r $(el)"
    done
    echo "== xswide $(el)"
    ;;
skip1)
    # where a one-row step goes on this card (issue 4's remaining gap): device time per op
    # (eager, REDLINE_PROFILE_OPS=1) and the graph-mode cost of each op kind (REDLINE_SKIP_OPS:
    # the step without it; outputs wrong), 32B
    wait $SP
    REDLINE_PROFILE_OPS=1 timeout 100 $R bench --device cuda -m /tmp/m32.gguf -p 0 -n 32 -r 1 >"$OUT/profile1_m32.txt" 2>&1
    grep -vE "^\s*$" "$OUT/profile1_m32.txt" | tail -40
    for k in X attention attention_block rms_norm rope_qk swiglu matmul_many matmul_add add; do
        ST="REDLINE_SKIP_OPS=$k" b m32 -n 64 -r 2
    done
    echo "== skip1 $(el)"
    ;;
ncuattn)
    # where the one-row attention chain (fa_decode_fused_d128, 12 us of a 32B step's critical
    # path per layer) waits: ncu per instruction, eager 32B steps
    timeout 200 devbin/t_gpu_decode --test-threads 1 x_in_shared 2>&1 | grep -E "^test |result|panicked|differ" | head -6
    wait $SP
    NCU=/usr/local/cuda/bin/ncu
    for k in fa_decode_fused_d128; do
        REDLINE_CUDA_GRAPHS=0 timeout 200 $NCU -k "regex:^$k\$" --launch-skip 200 --launch-count 2 \
            --section SourceCounters --section WarpStateStats --section SchedulerStats --section LaunchStats \
            --section Occupancy --section SpeedOfLight -o "$OUT/$k" -f \
            $R bench --device cuda -m /tmp/m32.gguf -p 0 -n 8 -r 1 >"$OUT/ncu_$k.log" 2>&1
        $NCU -i "$OUT/$k.ncu-rep" --page source --csv --print-source sass >"/tmp/src_$k.csv" 2>&1
        xz -c "/tmp/src_$k.csv" >"$OUT/src_$k.csv.xz"
        $NCU -i "$OUT/$k.ncu-rep" --page details >"$OUT/det_$k.txt" 2>&1
        rm -f "$OUT/$k.ncu-rep"
        python3 scripts/ncu-top.py "/tmp/src_$k.csv" 30 | cut -c1-200
        grep -E "Duration|Grid Size|Block Size|Registers Per|Achieved Occupancy|DRAM Throughput" "$OUT/det_$k.txt" | head -12
    done
    echo "== ncuattn $(el)"
    ;;
evict)
    # the matvec's weight loads evict-first in L2 (REDLINE_MV_LOAD=3, sm_80+) against the
    # default (2: L1 bypass only): one row of both models, rounds alternating
    wait $SP
    for r in ${ROUNDS:-1 2}; do
        for v in X=1 REDLINE_MV_LOAD=3; do
            for m in m32 m27; do ST=$v b $m -n 128 -r 2; done
        done
        echo "round $r $(el)"
    done
    echo "== evict $(el)"
    ;;
s22)
    timeout 120 devbin/t_gpu_matvec --test-threads 1 2>&1 | grep -E "^test |result|panicked" | head -6
    timeout 100 devbin/t_gpu_speculative --ignored --test-threads 1 2>&1 | grep -E "^test result|panicked|FAILED" | head -4
    echo "== checks $(el)"
    wait $SP
    for v in X=1 REDLINE_MV_DIRECT=0; do
        for m in m32 m27; do ST=$v b $m -n 128 -r 2; done
    done
    for m in m32 m27; do b $m -n 64 -r 2 --parallel 8; done
    echo "== s22 $(el)"
    [ -z "${SERVE:-}" ] || serve_rows p32 32 1,8,32
    ;;
table)
    # issue 4's bench table with the current defaults (session 21's direct kernels were never in
    # one): pp512 + tg128 of the 32B and 27B Q4_K_M and the 32B IQ4_XS, tg128 after 4096 tokens
    # on the 32B, the H200's 8-row per-op profile (issue 6's 6x: where an 8-row step goes).
    (while [ ! -e /tmp/synth.done ]; do sleep 2; done
        [ -e /tmp/x32.gguf ] || $R synth --shape qwen2.5-32b --type IQ4_XS -o /tmp/x32.gguf >/tmp/sx32.log 2>&1) &
    XP=$!
    wait $SP
    for m in m32 m27; do
        echo "$m table: $(timeout 200 $R bench --device cuda -m /tmp/$m.gguf -p 512 -n 128 -r 2 2>>"$OUT/err.txt" | grep -E '^\| qwen' | cut -d'|' -f8- | tr '\n' ' ')"
    done
    echo "m32 d4096: $(timeout 200 $R bench --device cuda -m /tmp/m32.gguf -p 0 -n 128 -d 4096 -r 2 2>>"$OUT/err.txt" | grep -E '^\| qwen' | cut -d'|' -f8- | tr '\n' ' ')"
    REDLINE_PROFILE_OPS=1 timeout 100 $R bench --device cuda -m /tmp/m32.gguf -p 0 -n 16 -r 1 --parallel 8 >"$OUT/prof8.txt" 2>&1
    sed -n "/op profile/,\$p" "$OUT/prof8.txt" | head -16 | cut -c1-120
    wait $XP
    echo "x32 table: $(timeout 200 $R bench --device cuda -m /tmp/x32.gguf -p 512 -n 128 -r 2 2>>"$OUT/err.txt" | grep -E '^\| qwen' | cut -d'|' -f8- | tr '\n' ' ')"
    echo "== table $(el)"
    ;;
s26c)
    # session 26: greedy picks on the device (argmax_cols) and recorded steps cut into
    # segments (REDLINE_STEP_SPLITS): the suites, the bench with and without segments, then
    # issue 6's serve rows at 1 / 8 streams with both (default) against neither
    # (REDLINE_DEVICE_GREEDY=0 REDLINE_STEP_SPLITS=0), step log on
    echo "t_backend_conformance: $(timeout 90 devbin/t_backend_conformance --ignored --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked" | head -4 | tr '\n' ' ')"
    for t in t_gpu_decode t_gpu_speculative t_backend_models; do
        echo "$t: $(timeout 150 devbin/$t --include-ignored --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|differ by" | head -4 | tr '\n' ' ')"
    done
    echo "== checks $(el)"
    ;;
s31a)
    # session 31 (written, not run: no device time that session): the 3-4-token Q4_K direct
    # kernels with x held a group of tokens at a time (REDLINE_MV_DIRECT_XG=1|2; 128 registers at
    # 2 rows a warp instead of 167). The matvec suite (bit for bit against the all-tokens kernels
    # and one-token rows), the four 27B shapes timed per variant (the g rows), then the verify
    # cost: rounds alternating default / XG=1 / XG=2, each also with every 4-token launch direct
    # (REDLINE_MV_DIRECT4=1); the speculative suite with XG=2. NO_SYNTH=1.
    [ -e /tmp/m27.gguf ] || ($R synth --shape qwen3.5-27b --type Q4_K_M -o /tmp/m27.gguf >/tmp/s27.log 2>&1) &
    S27=$!
    suite t_gpu_matvec
    echo "== checks $(el)"
    TIMING_SHAPES=down,out,gate/up,in-proj timeout 150 devbin/t_gpu_matvec --ignored --test-threads 1 --nocapture few_token_segment_timing 2>&1 | grep -E "^ +(down|out|gate/up|in-proj|op) " | grep -E "op|dispatch|r2 n3|r[12] g[12]|Q6_K" | head -32
    echo "== timing $(el)"
    wait $S27
    for r in 1 2 3; do
        for v in X=1 REDLINE_MV_DIRECT_XG=1 REDLINE_MV_DIRECT_XG=2 REDLINE_MV_DIRECT4=1 \
            "REDLINE_MV_DIRECT_XG=1 REDLINE_MV_DIRECT4=1" "REDLINE_MV_DIRECT_XG=2 REDLINE_MV_DIRECT4=1" \
            "REDLINE_MV_DIRECT_XG=1 REDLINE_MV_DIRECT_R34=1"; do
            vb "$v" 1,3,4 3
        done
    done
    echo "XG=2: $(REDLINE_MV_DIRECT_XG=2 suite t_gpu_speculative --ignored)"
    echo "== s31a $(el)"
    ;;
s32a)
    # session 32: s31a cut to fit a short device budget (failed starts cost 3 min each): the
    # matvec suite (the x-group kernels bit for bit), then verify cost rounds alternating
    # default / XG=1 / XG=2 / XG=2 with every 4-token launch direct; the speculative suite with
    # XG=2 last. NO_SYNTH=1.
    [ -e /tmp/m27.gguf ] || ($R synth --shape qwen3.5-27b --type Q4_K_M -o /tmp/m27.gguf >/tmp/s27.log 2>&1) &
    S27=$!
    suite t_gpu_matvec
    echo "== checks $(el)"
    wait $S27
    for r in 1 2 3; do
        for v in X=1 REDLINE_MV_DIRECT_XG=1 REDLINE_MV_DIRECT_XG=2 "REDLINE_MV_DIRECT_XG=2 REDLINE_MV_DIRECT4=1"; do
            vb "$v" 1,3,4 3
        done
        echo "round $r $(el)"
    done
    echo "XG=2: $(REDLINE_MV_DIRECT_XG=2 suite t_gpu_speculative --ignored)"
    echo "== s32a $(el)"
    ;;
s33a)
    # written in session 32 for the next window (~2 min): the final rule as one binary (G = 2
    # for 3-token launches of 12288+ rows only) against REDLINE_MV_DIRECT_XG=0 on the 27B's
    # verify cost, and the 32B's 3-row verify pass (its gate/up, 55296 rows, the one 32B launch
    # the rule moves); the suites. Synthesizes both files (no NO_SYNTH).
    suite t_gpu_matvec
    echo "== checks $(el)"
    wait $SP
    for r in 1 2 3; do
        for v in X=1 REDLINE_MV_DIRECT_XG=0; do
            vb "$v" 1,2,3,4 4
            VB_M=m32 vb "$v" 1,3 4
        done
        echo "round $r $(el)"
    done
    echo "default: $(suite t_gpu_speculative --ignored)"
    echo "== s33a $(el)"
    ;;
s33c)
    # session 33: the direct Q6_K kernels (mvd_q6_k_*, one-token launches below the heads' size
    # by default): the matvec suite (Q6_K rows at 1-4 tokens on them against the CPU
    # reference), the speculative suite, one row of both models against REDLINE_MV_DIRECT_Q6K=0,
    # one row a warp (REDLINE_MV_DIRECT_R_Q6K=1) and the heads on them too (rounds alternating),
    # the 27B's eager per-op profile with and without
    suite t_gpu_matvec
    echo "default: $(suite t_gpu_speculative --ignored)"
    echo "== checks $(el)"
    wait $SP
    for r in 1 2; do
        for v in X=1 REDLINE_MV_DIRECT_Q6K=0 REDLINE_MV_DIRECT_R_Q6K=1 REDLINE_MV_DIRECT_Q6K=heads; do
            for m in m27 m32; do ST=$v b $m -n 128 -r 2; done
        done
        echo "round $r $(el)"
    done
    # two tokens on them too (REDLINE_MV_DIRECT_Q6K=2; by default the q8_1 tensor-core kernels)
    for v in X=1 REDLINE_MV_DIRECT_Q6K=2; do
        ST=$v b m27 -n 64 -r 2 --parallel 2
        vb "$v" 1,2 3
    done
    # and 3-4 tokens (=all: 167-224 registers there, 2-3 blocks an SM; the heads too)
    for v in X=1 REDLINE_MV_DIRECT_Q6K=all; do vb "$v" 1,3,4 3; done
    for v in X=1 REDLINE_MV_DIRECT_Q6K=0; do
        echo "profile 27B $v:"
        env $v REDLINE_PROFILE_OPS=1 timeout 100 $R bench --device cuda -m /tmp/m27.gguf -p 0 -n 32 -r 1 2>&1 | grep -E "Q6_K|op profile" | head -10
    done
    echo "== s33c $(el)"
    ;;
s33d)
    # session 33: the conv window loaded before the PDL wait (mo_conv1d_qkv[_rows]) against the
    # kernels before (devbin/k_conv0: the old model_ops.cu), the 27B one row and its verify
    # passes of 1 and 3 rows, rounds alternating
    wait $SP
    OLD="REDLINE_KERNEL_DIR=$PWD/devbin/k_conv0"
    for r in 1 2 3; do
        for v in X=1 "$OLD"; do ST=$v b m27 -n 128 -r 2; done
    done
    for v in X=1 "$OLD"; do vb "$v" 1,3 3; done
    echo "== s33d $(el)"
    ;;
s33e)
    # session 33: s33c and s33d cut to fit a small device budget (six failed starts), both
    # changes opt-in since (the direct Q6_K kernels by REDLINE_MV_DIRECT_Q6K=1, the conv window
    # before the PDL wait through devbin/k_conv1): the matvec suite (Q6_K on the direct kernels
    # against the CPU reference), the conv checks with k_conv1, one row of the 27B (default /
    # Q6_K direct / Q6_K direct at one row a warp / k_conv1) and of the 32B (default / Q6_K
    # direct), two rounds alternating, the speculative suite with both
    NEW="REDLINE_KERNEL_DIR=$PWD/devbin/k_conv1"
    suite t_gpu_matvec
    echo "k_conv1: $(env $NEW timeout 100 devbin/t_backend_conformance --ignored --test-threads 1 conv1d 2>&1 | grep -E "FAIL|panicked|test result" | head -3 | tr '\n' ' ')"
    echo "== checks $(el)"
    wait $SP
    for r in 1 2; do
        for v in X=1 REDLINE_MV_DIRECT_Q6K=1 "REDLINE_MV_DIRECT_Q6K=1 REDLINE_MV_DIRECT_R_Q6K=1" "$NEW"; do
            ST=$v b m27 -n 128 -r 2
        done
        for v in X=1 REDLINE_MV_DIRECT_Q6K=1; do ST=$v b m32 -n 128 -r 2; done
        echo "round $r $(el)"
    done
    echo "Q6_K direct + k_conv1: $(REDLINE_MV_DIRECT_Q6K=1 REDLINE_KERNEL_DIR=$PWD/devbin/k_conv1 suite t_gpu_speculative --ignored)"
    echo "== s33e $(el)"
    ;;
s33f)
    # session 33, last window: the direct Q6_K kernels on the 32B at one row a warp and with
    # the head (s33e: 2 rows a warp lost 4.3 % there), and the 27B's issue-4 rows with the conv
    # window before the PDL wait (devbin/k_conv1, the next commit's default)
    NEW="REDLINE_KERNEL_DIR=$PWD/devbin/k_conv1"
    wait $SP
    for v in X=1 "REDLINE_MV_DIRECT_Q6K=1 REDLINE_MV_DIRECT_R_Q6K=1" REDLINE_MV_DIRECT_Q6K=heads X=1; do
        ST=$v b m32 -n 128 -r 2
    done
    echo "27B $NEW: $(env $NEW timeout 100 $R bench --device cuda -m /tmp/m27.gguf -p 512 -n 128 -r 2 2>&1 | grep -E '^\| qwen' | cut -d'|' -f7- | tr '\n' ' ')"
    ST="$NEW" b m27 -n 128 -r 2 -d 4096
    echo "== s33f $(el)"
    ;;
s41a)
    # next session: what holds the fused attention chain between its PDL wait and its query
    # heads in place (s40b's traces: 32B 4.9 µs, 27B 9.0 µs at depth 0, against ~2 µs of work):
    # the o projection's staged weights streaming during it (launched early through
    # REDLINE_PDL_EARLY bit 32; REDLINE_MV_STAGE=0 stages nothing before the wait) or not.
    # Pack: CLEAN=1 TRACE=1 PDL_MASKS=7 bash scripts/device-pack.sh
    wait $SP
    for r in 1 2; do
        for m in m32 m27; do
            for v in X=1 REDLINE_PDL_EARLY=7 REDLINE_MV_STAGE=0 "REDLINE_PDL_EARLY=7 REDLINE_MV_STAGE=0"; do
                ST=$v b $m -n 64 -r 2 -d 0
            done
        done
        echo "round $r $(el)"
    done
    for m in m32 m27; do
        TSEQ=24 trace_run a$m $m X=1
        TSEQ=24 trace_run b$m $m REDLINE_PDL_EARLY=7
        TSEQ=24 trace_run c$m $m REDLINE_PDL_EARLY=7 REDLINE_MV_STAGE=0
        for l in a$m b$m c$m; do echo "$l: $(grep -E '^ +fa ' $OUT/$l.txt | head -1)"; done
    done
    echo "== s41a $(el)"
    ;;
s40b)
    # session 40: the fused decode attention's first chunks loaded before the PDL wait (the
    # scratch out of the rings) against HEAD's kernel file (devbin/k_fa0, REDLINE_KERNEL_DIR),
    # with the whole-group choice (REDLINE_FA_WHOLE_GROUP_FROM) and 4 tiles a split; suites,
    # greedy text; then traces with the marks after the wait
    suite t_gpu_decode
    suite t_backend_conformance
    echo "== checks $(el)"
    wait $SP
    O="REDLINE_KERNEL_DIR=$PWD/devbin/k_fa0"
    greedy m32 X=1 $O REDLINE_FA_WHOLE_GROUP_FROM=1
    greedy m27 X=1 $O REDLINE_FA_WHOLE_GROUP_FROM=1
    W=REDLINE_FA_WHOLE_GROUP_FROM
    for r in 1 2; do
        for v in $O X=1 $W=1024; do ST=$v b m32 -n 64 -r 2 -d 0; done
        for v in X=1 $W=1 $W=1024; do ST=$v b m32 -n 64 -r 2 -d 1024; done
        for v in $O X=1 $W=1 $W=1024 "$W=1024 REDLINE_FA_TILES_PER_SPLIT=4"; do ST=$v b m32 -n 64 -r 2 -d 4096; done
        for d in 0 4096; do
            for v in $O X=1 $W=1; do ST=$v b m27 -n 64 -r 2 -d $d; done
        done
        echo "round $r $(el)"
    done
    TSEQ=24 trace_run t27 m27 X=1
    sed -n '/per class/,$p' $OUT/t27.txt
    TSEQ=24 trace_run t32 m32 X=1
    sed -n '/per class/,$p' $OUT/t32.txt
    TSEQ=24 TARGS="-d 4096" trace_run u32 m32 X=1
    sed -n '/per class/,$p' $OUT/u32.txt
    TSEQ=24 TARGS="-d 4096" trace_run v32 m32 REDLINE_FA_WHOLE_GROUP_FROM=1
    sed -n '/per class/,$p' $OUT/v32.txt
    echo "== s40b $(el)"
    ;;
s40a)
    # next session: a decode row's whole query-head group in one block from N positions
    # (REDLINE_FA_WHOLE_GROUP_FROM; s39d: 5 heads a block +3.5 % on the 32B at depth 4096, the
    # default 3 + 2 0.9-1.7 % faster at depth 0): the bit-for-bit test, greedy text, the 32B at
    # depths 0 / 1024 / 4096 and the 27B at 0 / 4096 under N = 0 (off) / 1 / 1024 / 2048
    suite t_gpu_decode whole_group
    echo "== checks $(el)"
    wait $SP
    greedy m32 X=1 REDLINE_FA_WHOLE_GROUP_FROM=1
    for r in 1 2; do
        for d in 0 1024 4096; do
            for v in X=1 REDLINE_FA_WHOLE_GROUP_FROM=1 REDLINE_FA_WHOLE_GROUP_FROM=1024 REDLINE_FA_WHOLE_GROUP_FROM=2048 \
                "REDLINE_FA_WHOLE_GROUP_FROM=1024 REDLINE_FA_TILES_PER_SPLIT=4"; do
                ST=$v b m32 -n 64 -r 2 -d $d
            done
        done
        for d in 0 4096; do
            for v in X=1 REDLINE_FA_WHOLE_GROUP_FROM=1; do ST=$v b m27 -n 64 -r 2 -d $d; done
        done
        echo "round $r $(el)"
    done
    echo "== s40a $(el)"
    ;;
s39e)
    # session 39: traces of the default path for the record (the closing analysis of issue 4)
    # and for the next session: the 27B and the 32B at depth 0, the 32B at depth 4096 (its
    # attention ~21 µs a layer more there, ~0.8 TB/s of KV) and with 5 query heads a block
    wait $SP
    TSEQ=24 trace_run t27 m27 X=1
    sed -n '/per class/,$p' $OUT/t27.txt
    TSEQ=24 trace_run t32 m32 X=1
    sed -n '/per class/,$p' $OUT/t32.txt
    TSEQ=24 TARGS="-d 4096" trace_run u32 m32 X=1
    sed -n '/per class/,$p' $OUT/u32.txt
    TSEQ=24 TARGS="-d 4096" trace_run v32 m32 REDLINE_FA_WHOLE_GROUP_FROM=1
    sed -n '/per class/,$p' $OUT/v32.txt
    echo "== s39e $(el)"
    ;;
s39d)
    # session 39: the 32B's depth cost (s39c: tg128 118.88 at depth 0, 102.21 at 4096: -14 %;
    # attention ~21 µs a layer more at 4096, ~0.8 TB/s of KV) under the decode attention's
    # knobs: query heads a block (default 3: two blocks a KV head of 5) and tiles a split
    wait $SP
    for r in 1 2; do
        for v in X=1 REDLINE_FA_HEADS_PER_BLOCK=5 REDLINE_FA_HEADS_PER_BLOCK=8 REDLINE_FA_HEADS_PER_BLOCK=1 \
            REDLINE_FA_TILES_PER_SPLIT=4 "REDLINE_FA_HEADS_PER_BLOCK=5 REDLINE_FA_TILES_PER_SPLIT=1"; do
            ST=$v b m32 -n 64 -r 2 -d 4096
        done
        echo "round $r $(el)"
    done
    echo "== s39d $(el)"
    ;;
s39c)
    # session 39, last window: the default path's verify cost (issue 8) and the issue-4 rows
    # (pp512 + tg128, tg128 at depth 4096) of both models
    wait $SP
    vb X=1 1,2,3,4 3
    for m in m27 m32; do
        echo "$m: $(timeout 150 $R bench --device cuda -m /tmp/$m.gguf -p 512 -n 128 -r 3 2>>"$OUT/err.txt" | grep -E '^\| qwen' | cut -d'|' -f6- | tr '\n' ' ')"
        ST=X=1 b $m -n 128 -r 2 -d 4096
    done
    echo "== s39c $(el)"
    ;;
s39b)
    # session 39, second pack: the queue's warps-ended count in two levels (a line's warps, then
    # the lines) and at most one counter a warp; the persistent and SwiGLU-epilogue kernels taken
    # out: the bit-for-bit tests, greedy text, default against the queue at K = 16 and 8 in three
    # rounds, the speculative suite with the queue
    suite t_gpu_decode queue
    suite t_gpu_matvec
    echo "== checks $(el)"
    wait $SP
    qk="REDLINE_MV_QUEUE=1 REDLINE_MV_QUEUE_K"
    greedy m27 X=1 "$qk=16"
    greedy m32 "$qk=16"
    for r in 1 2 3; do
        for v in X=1 "$qk=16" "$qk=8"; do ST=$v b m27 -n 128 -r 2; done
        for v in X=1 "$qk=16"; do ST=$v b m32 -n 128 -r 2; done
        echo "round $r $(el)"
    done
    echo "queue K=16: $(REDLINE_MV_QUEUE=1 suite t_gpu_speculative --ignored)"
    echo "== s39b $(el)"
    ;;
s39a)
    # session 39: the queue with nk ticket counters (REDLINE_MV_QUEUE_K; s38e: one counter lost
    # 12.5 % on the 27B) against the default (queue off): the bit-for-bit tests, greedy text, one
    # row of both models at K = 1 / 4 / 16 / 32 in two rounds, the SwiGLU epilogue and the queue
    # Q6_K kernels on the queue, a trace with K = 16, the verify cost and the speculative suite
    suite t_gpu_decode queue
    suite t_gpu_matvec
    echo "== checks $(el)"
    wait $SP
    old="REDLINE_MV_SWIGLU=0 REDLINE_MV_QUEUE=0"
    qk="REDLINE_MV_SWIGLU=0 REDLINE_MV_QUEUE=1 REDLINE_MV_QUEUE_K"
    greedy m27 "$old" "$qk=16" "$qk=4"
    greedy m32 "$qk=16"
    for r in 1 2; do
        for v in "$old" "$qk=1" "$qk=4" "$qk=16" "$qk=32" "REDLINE_MV_SWIGLU=1 REDLINE_MV_QUEUE=1 REDLINE_MV_QUEUE_K=16" \
            "$qk=16 REDLINE_MV_DIRECT_Q6K=1 REDLINE_MV_DIRECT_R_Q6K=1"; do
            ST=$v b m27 -n 128 -r 2
        done
        for v in "$old" "$qk=16"; do ST=$v b m32 -n 128 -r 2; done
        echo "round $r $(el)"
    done
    TSEQ=24 trace_run q27 m27 REDLINE_MV_SWIGLU=0 REDLINE_MV_QUEUE=1 REDLINE_MV_QUEUE_K=16
    tail -18 $OUT/q27.txt
    vb "$qk=16" 1,2,3,4 3
    echo "queue K=16: $(REDLINE_MV_QUEUE=1 REDLINE_MV_QUEUE_K=16 suite t_gpu_speculative --ignored)"
    echo "== s39a $(el)"
    ;;
s38e)
    suite t_gpu_decode swiglu
    suite t_gpu_decode queue
    echo "== checks $(el)"
    wait $SP
    new="REDLINE_MV_SWIGLU=1 REDLINE_MV_QUEUE=1"
    old="REDLINE_MV_SWIGLU=0 REDLINE_MV_QUEUE=0"
    q6="REDLINE_MV_DIRECT_Q6K=1 REDLINE_MV_DIRECT_R_Q6K=1 REDLINE_MV_SWIGLU=1 REDLINE_MV_QUEUE=1"
    for m in m27 m32; do greedy $m "$new" "$old"; done
    for r in 1 2; do
        for v in "$new" "$old" "REDLINE_MV_SWIGLU=0 REDLINE_MV_QUEUE=1" "REDLINE_MV_SWIGLU=1 REDLINE_MV_QUEUE=0"; do
            ST=$v b m27 -n 128 -r 2
            ST=$v b m32 -n 128 -r 2
        done
        ST="$q6" b m27 -n 128 -r 2
    done
    echo "== rounds $(el)"
    greedy m27 "$q6" "${q6/QUEUE=1/QUEUE=0}"
    suite t_gpu_matvec
    vb "$new" 1,2,3,4 3
    echo "== s38e $(el)"
    ;;
s38c)
    # session 38, one window: the queue products (REDLINE_MV_QUEUE) and the SwiGLU as the gate /
    # up product's epilogue (REDLINE_MV_SWIGLU), both on by default: the bit-for-bit tests,
    # greedy text, one row of both models in three rounds against the old default (both off)
    # and each alone, the queue Q6_K kernels (REDLINE_MV_DIRECT_Q6K=1, one row a warp), a trace,
    # the verify cost (issue 8), the speculative suite
    suite t_gpu_decode swiglu
    suite t_gpu_decode queue
    suite t_gpu_matvec
    echo "== checks $(el)"
    wait $SP
    new="REDLINE_MV_SWIGLU=1 REDLINE_MV_QUEUE=1"
    old="REDLINE_MV_SWIGLU=0 REDLINE_MV_QUEUE=0"
    q6="REDLINE_MV_DIRECT_Q6K=1 REDLINE_MV_DIRECT_R_Q6K=1 REDLINE_MV_SWIGLU=1 REDLINE_MV_QUEUE=1"
    for m in m27 m32; do greedy $m "$new" "$old" "REDLINE_MV_SWIGLU=0 REDLINE_MV_QUEUE=1" "REDLINE_MV_SWIGLU=1 REDLINE_MV_QUEUE=0"; done
    greedy m27 "$q6" "${q6/QUEUE=1/QUEUE=0}"
    for r in 1 2 3; do
        for v in "$new" "$old" "REDLINE_MV_SWIGLU=0 REDLINE_MV_QUEUE=1" "REDLINE_MV_SWIGLU=1 REDLINE_MV_QUEUE=0" "$q6"; do
            ST=$v b m27 -n 128 -r 2
            ST=$v b m32 -n 128 -r 2
        done
    done
    echo "== rounds $(el)"
    TSEQ=24 trace_run w27 m27 REDLINE_MV_SWIGLU=1 REDLINE_MV_QUEUE=1
    tail -18 $OUT/w27.txt
    echo "capture errors: $(grep -ci 'capture' "$OUT/err.txt")"
    vb "$new" 1,2,3,4 3
    suite t_gpu_speculative --ignored
    echo "== s38c $(el)"
    ;;
s37b)
    # session 37: the gates in the conv's launch on 256-thread blocks (REDLINE_CONV_GATES=0:
    # their own launch) and the fused attention's RoPE angle cache (REDLINE_ROPE_CACHE=0: every
    # launch computes them): the bit-for-bit tests, greedy text, one row of both models in three
    # rounds, the 27B's verify cost (issue 8), a trace of the new default
    suite t_backend_conformance --ignored conv1d
    suite t_backend_conformance --ignored attention
    suite t_gpu_decode conv_gates
    suite t_gpu_decode rope_cache
    suite t_gpu_decode fused
    echo "== checks $(el)"
    wait $SP
    for m in m27 m32; do greedy $m X=1 REDLINE_CONV_GATES=0 REDLINE_ROPE_CACHE=0; done
    for r in 1 2 3; do
        for v in X=1 REDLINE_CONV_GATES=0 REDLINE_ROPE_CACHE=0; do ST=$v b m27 -n 128 -r 2; done
        for v in X=1 REDLINE_ROPE_CACHE=0; do ST=$v b m32 -n 128 -r 2; done
    done
    vb X=1 1,2,3,4 3
    TSEQ=24 trace_run h27 m27 X=1
    tail -18 $OUT/h27.txt
    echo "capture errors: $(grep -ci 'capture' "$OUT/err.txt")"
    echo "== s37b $(el)"
    ;;
s37a)
    # session 37: the f32 alpha / beta products in the conv's launch (the default;
    # REDLINE_CONV_GATES=0 gives their own launch): the bit-for-bit tests, greedy text, one row
    # of the 27B in three rounds (the 32B has no DeltaNet layer: one round as a control), the
    # 27B's verify cost (issue 8) both ways, a trace of the new default
    suite t_backend_conformance --ignored conv1d
    suite t_gpu_decode conv_gates
    echo "== checks $(el)"
    wait $SP
    greedy m27 X=1 REDLINE_CONV_GATES=0
    for r in 1 2 3; do
        for v in X=1 REDLINE_CONV_GATES=0; do ST=$v b m27 -n 128 -r 2; done
    done
    for v in X=1 REDLINE_CONV_GATES=0; do ST=$v b m32 -n 128 -r 2; done
    vb X=1 1,2,3,4 3
    vb REDLINE_CONV_GATES=0 1,2,3,4 3
    TSEQ=24 trace_run g27 m27 X=1
    tail -18 $OUT/g27.txt
    echo "capture errors: $(grep -ci 'capture' "$OUT/err.txt")"
    echo "== s37a $(el)"
    ;;
s36d)
    # session 36: a trace of the shipped default (27B), the gated norm in the rule's launch
    # alone (REDLINE_FUSED_DN_NORM=1, without the persistent products) against it, two rounds
    wait $SP
    TSEQ=24 trace_run f27 m27 X=1
    tail -18 $OUT/f27.txt
    TSEQ=24 trace_run d27 m27 REDLINE_FUSED_DN_NORM=1
    tail -18 $OUT/d27.txt
    for r in 1 2; do
        for v in X=1 REDLINE_FUSED_DN_NORM=1; do ST=$v b m27 -n 128 -r 2; done
    done
    echo "== s36d $(el)"
    ;;
s36c)
    # session 36, the final binary: the suites (the fixed staged-fusions count), the speculative
    # suite, one row of both models (two rounds) and 8 streams at the shipped defaults against
    # the old norm launch
    suite t_gpu_decode
    suite t_gpu_speculative --ignored
    echo "== checks $(el)"
    wait $SP
    for m in m27 m32; do greedy $m X=1; done
    for r in 1 2; do
        for m in m27 m32; do
            for v in X=1 REDLINE_NORM_SPLIT=0; do ST=$v b $m -n 128 -r 2; done
        done
    done
    for m in m27 m32; do
        for v in X=1 REDLINE_NORM_SPLIT=0; do ST=$v b $m -n 64 -r 2 --parallel 8; done
    done
    echo "capture errors: $(grep -ci 'capture' "$OUT/err.txt")"
    echo "== s36c $(el)"
    ;;
s36b)
    # session 36: the norm's writes over several blocks (default now; REDLINE_NORM_SPLIT=0 the
    # old launch), the persistent one-token products (REDLINE_MV_PERSIST=1), lookahead mask 37
    # beside them, the gated norm in the rule's launch (REDLINE_FUSED_DN_NORM=1): the suites
    # (bit-for-bit tests of all three), greedy text, one row of both models in two rounds, then
    # traces with them on
    suite t_gpu_matvec
    suite t_gpu_decode
    echo "== checks $(el)"
    wait $SP
    for m in m27 m32; do greedy $m X=1 REDLINE_NORM_SPLIT=0 REDLINE_MV_PERSIST=1 "REDLINE_MV_PERSIST=1 REDLINE_FUSED_DN_NORM=1"; done
    for r in 1 2; do
        for m in m27 m32; do
            for v in X=1 REDLINE_NORM_SPLIT=0 REDLINE_MV_PERSIST=1 "REDLINE_MV_PERSIST=1 REDLINE_PDL_EARLY=37"; do
                ST=$v b $m -n 128 -r 2
            done
        done
        ST="REDLINE_MV_PERSIST=1 REDLINE_FUSED_DN_NORM=1" b m27 -n 128 -r 2
        echo "round $r $(el)"
    done
    TSEQ=24 trace_run p27 m27 REDLINE_MV_PERSIST=1 REDLINE_FUSED_DN_NORM=1
    tail -22 $OUT/p27.txt
    TSEQ=24 trace_run p32 m32 REDLINE_MV_PERSIST=1
    tail -16 $OUT/p32.txt
    echo "capture errors: $(grep -ci 'capture' "$OUT/err.txt")"
    echo "== s36b $(el)"
    ;;
s36a)
    # session 36: the block-timeline probe (REDLINE_TRACE, scripts/trace-summary.py): the
    # suites at this binary, then one traced replay of each model at the default and of the
    # 27B at the old order (no lookahead, no staging), the probe's own cost in tok/s
    suite t_gpu_matvec
    suite t_gpu_decode
    echo "== checks $(el)"
    wait $SP
    trace_run m27 m27 X=1
    trace_run m27old m27 REDLINE_PDL_EARLY=0 REDLINE_MV_STAGE=0
    trace_run m32 m32 X=1
    echo "== traces $(el)"
    for m in m27 m32; do ST=X=1 b $m -n 64 -r 1; done
    cat $OUT/m27.txt | tail -40
    echo "== s36a $(el)"
    ;;
s35g)
    # session 35 (if a machine comes): the shipped default (mask 39 at every row count) at 8
    # streams against mask 0, two rounds, after the decode suite
    suite t_gpu_decode
    wait $SP
    for r in 1 2; do
        for m in m27 m32; do
            for v in X=1 REDLINE_PDL_EARLY=0; do ST=$v b $m -n 64 -r 2 --parallel 8; done
        done
    done
    echo "== s35g $(el)"
    ;;
s35f)
    # session 35: the lookahead taken only by one-row launches (pdl_enter's one_row): the
    # suites, greedy text against the old order, one row of both models (two rounds) and 8
    # streams (one) against the old defaults
    suite t_gpu_decode
    suite t_gpu_speculative --ignored
    echo "== checks $(el)"
    wait $SP
    for m in m27 m32; do greedy $m X=1 "REDLINE_PDL_EARLY=0 REDLINE_MV_STAGE=0"; done
    for r in 1 2; do
        for m in m27 m32; do
            for v in X=1 "REDLINE_PDL_EARLY=0 REDLINE_MV_STAGE=0"; do
                ST=$v b $m -n 128 -r 2
            done
        done
        echo "round $r $(el)"
    done
    for m in m27 m32; do
        for v in X=1 "REDLINE_PDL_EARLY=0 REDLINE_MV_STAGE=0"; do
            ST=$v b $m -n 64 -r 2 --parallel 8
        done
    done
    echo "capture errors: $(grep -ci 'capture' "$OUT/err.txt")"
    echo "== s35f $(el)"
    ;;
s35e)
    # session 35: which lookahead bits cost the 27B's 2-row verify pass (s35d: 1.18x a step
    # at mask 39 against 1.14x at 0): the verify cost at masks 0 / 7 / 32 / 39, two rounds;
    # then 8 streams of both models at the new default against mask 0 and the old defaults
    wait $SP
    for r in 1 2; do
        for v in REDLINE_PDL_EARLY=0 REDLINE_PDL_EARLY=7 REDLINE_PDL_EARLY=32 X=1; do vb $v 1,2,4 4; done
        echo "round $r $(el)"
    done
    for m in m27 m32; do
        for v in X=1 REDLINE_PDL_EARLY=0 "REDLINE_PDL_EARLY=0 REDLINE_MV_STAGE=0"; do
            ST=$v b $m -n 64 -r 2 --parallel 8
        done
    done
    echo "== s35e $(el)"
    ;;
s35d)
    # session 35: the new defaults (REDLINE_PDL_EARLY=39 and the staged out / o projections)
    # on the card: the suites, greedy text against the old order, one row of both models
    # against the old defaults and against 4 staged rows a warp, rounds alternating; the
    # 27B's verify cost
    suite t_gpu_matvec
    suite t_gpu_decode
    suite t_backend_conformance
    suite t_gpu_speculative --ignored
    echo "== checks $(el)"
    wait $SP
    for m in m27 m32; do greedy $m X=1 "REDLINE_PDL_EARLY=0 REDLINE_MV_STAGE=0"; done
    for r in 1 2; do
        for m in m27 m32; do
            for v in X=1 "REDLINE_PDL_EARLY=0 REDLINE_MV_STAGE=0" REDLINE_MV_STAGE_R=4; do
                ST=$v b $m -n 128 -r 2
            done
        done
        echo "round $r $(el)"
    done
    echo "capture errors: $(grep -ci 'capture' "$OUT/err.txt")"
    vb X=1 1,2,3,4 4
    vb "REDLINE_PDL_EARLY=0 REDLINE_MV_STAGE=0" 1,2,3,4 4
    echo "== s35d $(el)"
    ;;
s35c)
    # session 35: the staged one-token Q4_K kernels (REDLINE_MV_STAGE=1: each warp copies its
    # rows into shared memory before the PDL wait; only launches of one wave: the out / o
    # projections) alone and with two kernels of lookahead in front of them
    # (REDLINE_PDL_EARLY=7: the DeltaNet chain, 32: the attention chain, 39: both): the
    # product suite (the staged kernels bit for bit the unstaged ones), the decode suites with
    # it on, greedy text of both models, one row of both, rounds alternating, the 27B's eager
    # profile with it on
    suite t_gpu_matvec
    REDLINE_MV_STAGE=1 REDLINE_PDL_EARLY=39 suite t_gpu_decode fused
    REDLINE_MV_STAGE=1 suite t_gpu_decode
    echo "== checks $(el)"
    wait $SP
    for m in m27 m32; do greedy $m X=1 "REDLINE_MV_STAGE=1 REDLINE_PDL_EARLY=39"; done
    for r in 1 2; do
        for v in X=1 REDLINE_MV_STAGE=1 REDLINE_PDL_EARLY=7 "REDLINE_PDL_EARLY=7 REDLINE_MV_STAGE=1" \
            "REDLINE_PDL_EARLY=39 REDLINE_MV_STAGE=1"; do
            ST=$v b m27 -n 128 -r 2
        done
        for v in X=1 REDLINE_MV_STAGE=1 REDLINE_PDL_EARLY=32 "REDLINE_PDL_EARLY=32 REDLINE_MV_STAGE=1"; do
            ST=$v b m32 -n 128 -r 2
        done
        echo "round $r $(el)"
    done
    echo "capture errors: $(grep -ci 'capture' "$OUT/err.txt")"
    for v in X=1 REDLINE_MV_STAGE=1; do
        env $v REDLINE_PROFILE_OPS=1 timeout 100 $R bench --device cuda -m /tmp/m27.gguf -p 0 -n 32 -r 1 >"$OUT/prof_$(echo $v | tr -c 'A-Za-z0-9\n' _).txt" 2>&1
    done
    grep -E "matmul_add|matmul_many" "$OUT"/prof_*.txt | head -8
    echo "== s35c $(el)"
    ;;
s35b)
    # session 35: REDLINE_PDL_EARLY (small kernels trigger their dependents before their own
    # wait: two kernels of lookahead) with and without REDLINE_MV_PREFETCH: the decode suites
    # with both on, greedy text of both models off / on (the same tokens), then one row of
    # both, rounds alternating (7: conv, delta rule, gated norm: the 27B's out-projection
    # launches during its layer's chain; 127: every class; the 32B has no DeltaNet, so no 7)
    REDLINE_PDL_EARLY=127 REDLINE_MV_PREFETCH=1 suite t_gpu_decode fused
    REDLINE_PDL_EARLY=127 suite t_gpu_decode
    REDLINE_MV_PREFETCH=1 suite t_gpu_matvec
    echo "== checks $(el)"
    wait $SP
    for m in m27 m32; do greedy $m X=1 "REDLINE_PDL_EARLY=127 REDLINE_MV_PREFETCH=1"; done
    for r in 1 2; do
        for v in X=1 REDLINE_MV_PREFETCH=1 REDLINE_PDL_EARLY=7 "REDLINE_PDL_EARLY=7 REDLINE_MV_PREFETCH=1" \
            REDLINE_PDL_EARLY=127 "REDLINE_PDL_EARLY=127 REDLINE_MV_PREFETCH=1"; do
            ST=$v b m27 -n 128 -r 2
        done
        for v in X=1 REDLINE_MV_PREFETCH=1 REDLINE_PDL_EARLY=127 "REDLINE_PDL_EARLY=127 REDLINE_MV_PREFETCH=1"; do
            ST=$v b m32 -n 128 -r 2
        done
        echo "round $r $(el)"
    done
    echo "capture errors: $(grep -ci 'capture' "$OUT/err.txt")"
    echo "== s35b $(el)"
    ;;
s35a)
    # written in session 34 for the next window (not run): REDLINE_MV_PREFETCH=1 (each direct
    # kernel's warp asks for its rows in one bulk L2 prefetch at its start): the matvec and
    # decode suites with it on, one row of both models against off (rounds alternating), the
    # 27B's eager per-op profile with it on (the out/o launches: 12.2 µs a call off)
    REDLINE_MV_PREFETCH=1 suite t_gpu_matvec
    REDLINE_MV_PREFETCH=1 suite t_gpu_decode fused
    echo "== checks $(el)"
    wait $SP
    for r in 1 2; do
        for m in m27 m32; do
            for v in X=1 REDLINE_MV_PREFETCH=1; do ST=$v b $m -n 128 -r 2; done
        done
    done
    REDLINE_MV_PREFETCH=1 REDLINE_PROFILE_OPS=1 timeout 100 $R bench --device cuda -m /tmp/m27.gguf -p 0 -n 32 -r 1 >"$OUT/prof_mvpf.txt" 2>&1
    grep -E "op profile|matmul_add|matmul_many" "$OUT/prof_mvpf.txt" | head -10
    echo "== s35a $(el)"
    ;;
s34d)
    # session 34: why the side-stream prefetch bought nothing: the 27B's eager per-op profile
    # with it off and on (an out-projection read from L2 would take fewer µs a call), then
    # the new default (3 query heads a decode block) against 8, one row of both models, after
    # the attention checks at the new default
    suite t_backend_conformance --ignored attention
    suite t_gpu_decode fused
    suite t_gpu_decode l2_prefetch
    echo "== checks $(el)"
    wait $SP
    for v in REDLINE_L2_PREFETCH=0 REDLINE_L2_PREFETCH=24; do
        env $v REDLINE_PROFILE_OPS=1 timeout 100 $R bench --device cuda -m /tmp/m27.gguf -p 0 -n 32 -r 1 >"$OUT/prof_${v//=/_}.txt" 2>&1
        echo "$v:"
        grep -E "op profile|matmul_add|matmul_many|conv1d|delta_rule|attention_block|gated_rms" "$OUT/prof_${v//=/_}.txt" | head -14
    done
    for m in m32 m27; do
        for v in X=1 REDLINE_FA_HEADS_PER_BLOCK=8; do ST=$v b $m -n 128 -r 2; done
    done
    echo "== s34d $(el)"
    ;;
s34c)
    # session 34: REDLINE_FA_HEADS_PER_BLOCK=3 against the default, one row of both models,
    # two rounds alternating (s33g's 32B +1 % again?)
    wait $SP
    for r in 1 2; do
        for m in m32 m27; do
            for v in X=1 REDLINE_FA_HEADS_PER_BLOCK=3; do ST=$v b $m -n 128 -r 2; done
        done
    done
    echo "== s34c $(el)"
    ;;
s34b)
    # session 34: the next products' weights toward L2 while a layer's chain runs
    # (REDLINE_L2_PREFETCH=MiB; the first window issued them from mo_conv1d_qkv and
    # fa_decode_fused themselves, now mo_l2_prefetch on a side stream): greedy text of
    # both models with it off and on (a hint: the same tokens), then one row of both at
    # 0 / 16 / 24 / 32 MiB and 24 with the layer norms' hint (REDLINE_L2_PREFETCH_NORM=8),
    # rounds alternating
    wait $SP
    for m in m27 m32; do
        for v in REDLINE_L2_PREFETCH=0 "REDLINE_L2_PREFETCH=24 REDLINE_L2_PREFETCH_NORM=8"; do
            t=$(env $v timeout 90 $R run -m /tmp/$m.gguf --device cuda -p 'The quick brown fox' -n 32 --temp 0 2>>"$OUT/err.txt")
            echo "$m $v: $(echo "$t" | md5sum | cut -c1-12) $(echo "$t" | tr '\n' ' ' | cut -c1-60)"
        done
    done
    for r in 1 2; do
        for m in m27 m32; do
            for v in REDLINE_L2_PREFETCH=0 REDLINE_L2_PREFETCH=16 REDLINE_L2_PREFETCH=24 REDLINE_L2_PREFETCH=32 \
                "REDLINE_L2_PREFETCH=24 REDLINE_L2_PREFETCH_NORM=8"; do
                ST=$v b $m -n 128 -r 2
            done
        done
        echo "round $r $(el)"
    done
    echo "capture errors: $(grep -ci 'capture' "$OUT/err.txt")"
    echo "== s34b $(el)"
    ;;
s34a)
    # session 34: after s33g: the 27B verify cost with the direct Q6_K kernels at 3-4 tokens
    # (REDLINE_MV_DIRECT_Q6K=all) against the default, rounds alternating
    for r in 1 2; do
        for v in X=1 REDLINE_MV_DIRECT_Q6K=all; do vb "$v" 1,2,3,4 3; done
    done
    echo "== s34a $(el)"
    ;;
s33g)
    # session 33: decode blocks of fewer query heads (REDLINE_FA_HEADS_PER_BLOCK: the 27B's 4 KV
    # heads of 6 query heads each are 4 blocks at one split; 2 heads a block make 12, 3 make 8;
    # the 32B's 8 of 5: 8 -> 24 / 16): the attention checks with 2 and 3, then one row of both
    # models, rounds alternating
    for h in 2 3; do
        echo "hpb $h: $(REDLINE_FA_HEADS_PER_BLOCK=$h suite t_backend_conformance --ignored attention)"
        echo "hpb $h: $(REDLINE_FA_HEADS_PER_BLOCK=$h suite t_gpu_decode fused_matches_unfused_and_cpu_on_fixtures)"
    done
    echo "== checks $(el)"
    wait $SP
    for m in m27 m32; do
        for v in X=1 REDLINE_FA_HEADS_PER_BLOCK=2 REDLINE_FA_HEADS_PER_BLOCK=3 X=1 REDLINE_FA_HEADS_PER_BLOCK=2; do
            ST=$v b $m -n 128 -r 2
        done
    done
    echo "== s33g $(el)"
    ;;
s33b)
    # session 33: where a one-row 27B step goes now (issue 4's gap; session 19 did the 32B):
    # eager device time per op (REDLINE_PROFILE_OPS=1), then the graph-mode cost of each op
    # kind and of groups of them (REDLINE_SKIP_OPS: the step without them; outputs wrong)
    wait $SP
    REDLINE_PROFILE_OPS=1 timeout 100 $R bench --device cuda -m /tmp/m27.gguf -p 0 -n 32 -r 1 >"$OUT/profile1_m27.txt" 2>&1
    grep -vE "^\s*$" "$OUT/profile1_m27.txt" | tail -32
    for k in X matmul_many matmul_add matmul_many,matmul_add rms_norm conv1d_qkv delta_rule_gated gated_rms_norm swiglu \
        attention_block rms_norm,conv1d_qkv,delta_rule_gated,gated_rms_norm,swiglu,attention_block X; do
        ST="REDLINE_SKIP_OPS=$k" b m27 -n 64 -r 2
    done
    echo "== s33b $(el)"
    ;;
s32b)
    # session 32: the x-group kernels by size (G = 2 from 12288 rows, 4-token direct up to 24576
    # rows) as the default: the suites, the four 27B shapes' dispatch, the verify cost against
    # REDLINE_MV_DIRECT_XG=0 (rounds alternating). NO_SYNTH=1.
    [ -e /tmp/m27.gguf ] || ($R synth --shape qwen3.5-27b --type Q4_K_M -o /tmp/m27.gguf >/tmp/s27.log 2>&1) &
    S27=$!
    suite t_gpu_matvec
    TIMING_SHAPES=down,out,gate/up,in-proj timeout 150 devbin/t_gpu_matvec --ignored --test-threads 1 --nocapture few_token_segment_timing 2>&1 | grep -E "^ +(down|out|gate/up|in-proj|op) " | grep -E " op |dispatch" | head -12
    echo "== checks $(el)"
    wait $S27
    for r in 1 2 3; do
        for v in X=1 REDLINE_MV_DIRECT_XG=0; do
            vb "$v" 1,2,3,4 4
        done
        echo "round $r $(el)"
    done
    echo "default: $(suite t_gpu_speculative --ignored)"
    for v in X=1 REDLINE_MV_DIRECT_XG=0; do ST=$v b m27 -n 64 -r 2 --parallel 4; done
    echo "== s32b $(el)"
    ;;
s31b)
    # session 31 (written, not run): ncu on the x-group kernels in a 4-row verify pass, every
    # 4-token Q4_K launch on them (REDLINE_MV_DIRECT_XG=2 REDLINE_MV_DIRECT4=1; session 30's s30b
    # has mvd_q4_k_n4_r2 and mmv_q4_k_t4 in the same pass for comparison)
    [ -e /tmp/m27.gguf ] || $R synth --shape qwen3.5-27b --type Q4_K_M -o /tmp/m27.gguf >/tmp/s27.log 2>&1
    NCU=/usr/local/cuda/bin/ncu
    env REDLINE_MV_DIRECT_XG=2 REDLINE_MV_DIRECT4=1 REDLINE_CUDA_GRAPHS=0 timeout 200 $NCU -k "regex:^mvd_q4_k_n4_r2_g2\$" \
        --launch-skip 8 --launch-count 8 --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section SchedulerStats -o "$OUT/g2" -f \
        $R verify-bench -k 4 -d 16 -r 1 --device cuda -m /tmp/m27.gguf >"$OUT/ncu_g2.log" 2>&1
    $NCU -i "$OUT/g2.ncu-rep" --page details >"$OUT/det_g2.txt" 2>&1
    rm -f "$OUT/g2.ncu-rep"
    grep -E "^  [a-z]|Duration|Grid Size|Registers Per|Achieved Occupancy|Theoretical Occupancy|DRAM Throughput|Issue Slots Busy|Warp Cycles Per Issued|Eligible Warps|No Eligible|Block Limit" "$OUT/det_g2.txt" | head -80 | cut -c1-150
    echo "== s31b $(el)"
    ;;
s30c)
    # session 30 (written, not run: no device time left): does the three-token switch move a
    # 2-row verify pass? (it has no 3-token launch; session 30 saw 1.16-1.18x with it on against
    # 1.12-1.16x off). Four alternating rounds of k = 1, 2, 3 with more repetitions. NO_SYNTH=1.
    [ -e /tmp/m27.gguf ] || $R synth --shape qwen3.5-27b --type Q4_K_M -o /tmp/m27.gguf >/tmp/s27.log 2>&1
    for r in 1 2 3 4; do
        for v in X=1 REDLINE_MV_DIRECT_N3=0; do
            vb "$v" 1,2,3 6
        done
    done
    echo "== s30c $(el)"
    ;;
s30b)
    # session 30: why the tensor-core Q4_K kernels stream slower than the direct dp4a kernel at
    # one token (27B gate/up 44.8 against 36.5 us), and what bounds the 4-row verify products
    # (mmv_q4_k_t4: gate/up, in-projections; mvd_q4_k_n4_r2: down, out): ncu on eager 27B
    # steps (REDLINE_MMV2_MIN=1: the staged mmv2 kernel at one token) and verify passes
    [ -e /tmp/m27.gguf ] || $R synth --shape qwen3.5-27b --type Q4_K_M -o /tmp/m27.gguf >/tmp/s27.log 2>&1
    NCU=/usr/local/cuda/bin/ncu
    # (session 27's s27c has the direct kernel at one token: mvd_q4_k_n1_r2 gate/up 40.5 us under
    # ncu, DRAM 75.6 %, 0.63 eligible warps a scheduler)
    for kv in "mmv2s_q4_k_s2 REDLINE_MMV2_MIN=1 bench" "(mmv_q4_k_t4|mvd_q4_k_n4_r2) X=1 verify"; do
        read -r k v c <<<"$kv"
        f=$(echo "$k" | tr -dc 'a-z0-9_')
        if [ "$c" = bench ]; then c="bench -p 0 -n 4 -r 1"; else c="verify-bench -k 4 -d 16 -r 1"; fi
        env $v REDLINE_CUDA_GRAPHS=0 timeout 200 $NCU -k "regex:^$k\$" --launch-skip 8 --launch-count 6 \
            --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
            --section SchedulerStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables -o "$OUT/$f" -f \
            $R $c --device cuda -m /tmp/m27.gguf >"$OUT/ncu_$f.log" 2>&1
        $NCU -i "$OUT/$f.ncu-rep" --page details >"$OUT/det_$f.txt" 2>&1
        $NCU -i "$OUT/$f.ncu-rep" --page raw --csv >"$OUT/raw_$f.csv" 2>&1
        rm -f "$OUT/$f.ncu-rep"
        echo "$k:"
        grep -E "^  [a-z]|Duration|Grid Size|Registers Per|Achieved Occupancy|Theoretical Occupancy|DRAM Throughput|Memory Throughput|L1/TEX Cache Throughput|Issue Slots Busy|Warp Cycles Per Issued|Eligible Warps|No Eligible|Block Limit|Dynamic Shared|Static Shared" "$OUT/det_$f.txt" | head -80 | cut -c1-150
        python3 - "$OUT/raw_$f.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hi = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
h = rows[hi]
keep = [i for i, n in enumerate(h) if ("issue_stalled" in n and "per_issue_active" in n and "not_issued" not in n) or n in (
    "launch__grid_size", "gpu__time_duration.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum", "smsp__inst_executed.sum", "dram__bytes_read.sum")]
for r in rows[hi + 2:]:
    if len(r) < len(h):
        continue
    vals = [(h[i].replace("smsp__average_warps_issue_stalled_", "st_").replace("_per_issue_active.ratio", ""), r[i]) for i in keep]
    def num(x):
        try:
            return float(x.replace(",", ""))
        except ValueError:
            return 0.0
    vals = [(n, x) for n, x in vals if not n.startswith("st_") or num(x) >= 0.25]
    print("  " + " ".join(f"{n}={x}" for n, x in vals))
PY
    done
    echo "== s30b $(el)"
    ;;
s30a)
    # session 30: the review commit d08edee (mv_x helper, staged q8_1 Q4_K kernel removed) on the
    # card: the product suite (q8_1 Q6_K kernels, K split, tiled x), the speculative suite
    suite t_gpu_mmq
    suite t_gpu_speculative --ignored
    echo "== s30a $(el)"
    ;;
s29e)
    # session 29: three-token direct kernels (mvd_*_n3_*, REDLINE_MV_DIRECT_N3=1) against the
    # four-token ones at three tokens: the matvec suite (bit for bit, n3 variants), the down /
    # out timing, the 27B verify cost, rounds alternating. NO_SYNTH=1 (only the 27B is written).
    [ -e /tmp/m27.gguf ] || ($R synth --shape qwen3.5-27b --type Q4_K_M -o /tmp/m27.gguf >/tmp/s27.log 2>&1) &
    S27=$!
    echo "t_gpu_matvec: $(timeout 200 devbin/t_gpu_matvec --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|failures so far" | head -6 | tr '\n' ' ')"
    echo "== checks $(el)"
    TIMING_SHAPES=down,out,gate/up,in-proj timeout 150 devbin/t_gpu_matvec --ignored --test-threads 1 --nocapture few_token_segment_timing 2>&1 | grep -E "^ +(down|out|gate/up|in-proj|op) " | grep -vE "r4|xs|staged" | head -24
    echo "== timing $(el)"
    wait $S27
    for r in 1 2; do
        for v in X=1 REDLINE_MV_DIRECT_N3=1 "REDLINE_MV_DIRECT_N3=1 REDLINE_MV_DIRECT4=1"; do
            [ $r = 2 ] && [ "$v" != "${v#*DIRECT4}" ] && continue
            vb "$v" 1,2,3,4 3
        done
    done
    echo "N3: $(REDLINE_MV_DIRECT_N3=1 suite t_gpu_speculative --ignored)"
    echo "== s29e $(el)"
    ;;
s29d)
    # session 29, the final kernels (x just in time and REDLINE_MV_L2PF taken out again): the
    # matvec suite (the bit-for-bit check with Q4_0 on these kernels), the speculative suite,
    # the 27B verify cost twice. Run with NO_SYNTH=1 (only the 27B is written here).
    [ -e /tmp/m27.gguf ] || ($R synth --shape qwen3.5-27b --type Q4_K_M -o /tmp/m27.gguf >/tmp/s27.log 2>&1) &
    S27=$!
    echo "t_gpu_matvec: $(timeout 200 devbin/t_gpu_matvec --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|failures so far" | head -6 | tr '\n' ' ')"
    echo "t_gpu_speculative: $(timeout 200 devbin/t_gpu_speculative --ignored --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|differs" | head -4 | tr '\n' ' ')"
    echo "== checks $(el)"
    wait $S27
    for r in 1 2; do
        echo "verify: $(timeout 100 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,3,4 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | tr -s ' ' | cut -d'|' -f3,4 | tr '\n' ' ')"
    done
    echo "== s29d $(el)"
    ;;
s29c)
    # session 29: x just in time in the direct kernels at 3-4 tokens too (built in; devbin/k_base =
    # the kernels without it) and 1 or 2 rows a warp by waves there; REDLINE_MV_L2PF=1 (the
    # segment kernels' rows asked into L2 before the PDL wait). Short of device time: what
    # matters first, first (the matvec suite with the bit-for-bit check now with Q4_0, the
    # down / out timing against k_base, one row against L2PF, the verify cost against k_base,
    # the speculative suite, then second rounds and the other suites)
    K=REDLINE_KERNEL_DIR=$PWD/devbin/k_base
    echo "t_gpu_matvec: $(timeout 200 devbin/t_gpu_matvec --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|failures so far" | head -6 | tr '\n' ' ')"
    echo "== checks $(el)"
    for v in X=1 $K; do
        echo "timing $v:"
        env $v TIMING_SHAPES=down,out timeout 120 devbin/t_gpu_matvec --ignored --test-threads 1 --nocapture few_token_segment_timing 2>&1 | grep -E "^ +(down|out|op) " | grep -vE "r4|xs" | head -12
    done
    echo "== timing $(el)"
    wait $SP
    l2pf() {
        for v in X=1 REDLINE_MV_L2PF=1; do
            ST=$v b m32 -n 128 -r 2
            ST=$v b m27 -n 128 -r 2
        done
    }
    vb() {
        for v in "$@"; do
            echo "verify $v: $(env $v timeout 100 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,3,4 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | tr -s ' ' | cut -d'|' -f3,4 | tr '\n' ' ')"
        done
    }
    l2pf
    echo "== l2pf $(el)"
    vb X=1 $K
    echo "== verify $(el)"
    echo "t_gpu_speculative: $(timeout 200 devbin/t_gpu_speculative --ignored --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|differs" | head -4 | tr '\n' ' ')"
    echo "== spec $(el)"
    l2pf
    ST=REDLINE_MV_L2PF=1 b m27 -n 64 -r 2 --parallel 2
    b m27 -n 64 -r 2 --parallel 2
    echo "== l2pf 2 $(el)"
    vb X=1 $K REDLINE_MV_DIRECT4=1 "REDLINE_MV_DIRECT4=1 $K"
    echo "== verify 2 $(el)"
    for t in "t_gpu_decode" "t_gpu_mmq" "t_backend_conformance --ignored" "t_backend_models --ignored"; do
        echo "$t: $(timeout 200 devbin/$t --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked" | head -4 | tr '\n' ' ')"
    done
    echo "== s29c $(el)"
    ;;
s29b)
    # session 29: Q6_K's tiled-x variant (mmv2_q6_k_q81t: 2-row verify passes) and Q4_K's 3-8-token
    # products on q8_1 through the staged kernel (mmv2s_q4_k_s2_q81, removed since; REDLINE_MMV_Q4K=0: the
    # block-diagonal register-fragment kernels as before; REDLINE_MV_DIRECT4=0: the short
    # launches on it too): checks, the 27B verify cost per variant, the speculative suite, the
    # Q4_K sweep at the 27B's shapes, the per-op profile of verify passes of 1 and 4 rows, one
    # row and two streams of the 27B (plain runs: unchanged kernels expected)
    echo "t_gpu_mmq mmv: $(timeout 150 devbin/t_gpu_mmq --test-threads 1 --nocapture mmv_ 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|checked +Q[46]_K" | head -14 | tr '\n' ' ')"
    echo "== checks $(el)"
    wait $SP
    for v in X=1 REDLINE_MMV_Q4K=0 "REDLINE_MMV_Q4K=0 REDLINE_MMV_Q6K=0" REDLINE_MV_DIRECT4=0 REDLINE_MMV2_MIN_Q6K=1 X=1; do
        echo "verify $v: $(env $v timeout 100 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,3,4 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | tr -s ' ' | cut -d'|' -f3,4 | tr '\n' ' ')"
    done
    echo "== verify $(el)"
    echo "t_gpu_speculative: $(timeout 200 devbin/t_gpu_speculative --ignored --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|differs" | head -4 | tr '\n' ' ')"
    echo "== spec $(el)"
    MMV2_SWEEP_TYPES=Q4_K MMV2_SWEEP_COUNTS=1,2,3,4 MMV2_SWEEP_SHAPES=34816x5120,16384x5120,5120x17408,5120x6144 \
        timeout 100 devbin/t_gpu_mmq --ignored --test-threads 1 --nocapture mmv2_timing >"$OUT/q4_sweep.txt" 2>&1
    grep -E "^ *q4_K|type|panicked" "$OUT/q4_sweep.txt" | grep -v " w[0-9]m" | head -20
    echo "== sweep $(el)"
    for k in 1 4; do
        REDLINE_PROFILE_OPS=1 timeout 150 $R verify-bench -m /tmp/m27.gguf --device cuda -k $k -d 256 -r 3 >"$OUT/verify_profile_k$k.txt" 2>&1
        grep -E '^\| (decode|verify)|op profile' "$OUT/verify_profile_k$k.txt"
        grep -vE '^\|' "$OUT/verify_profile_k$k.txt" | grep -A24 "^op " | cut -c1-110
    done
    echo "== profile $(el)"
    for v in X=1 "REDLINE_MMV_Q4K=0 REDLINE_MMV_Q6K=0"; do
        ST=$v b m27 -n 128 -r 2
        ST=$v b m27 -n 64 -r 2 --parallel 2
    done
    echo "== s29b $(el)"
    ;;
s29a)
    # session 29: Q6_K's few-token products on q8_1 x through mmv2's staged kernel
    # (mmv2_q6_k_q81; REDLINE_MMV_Q6K=0: the dp4a matvec as before): its checks against the CPU
    # q8_1 reference, the 27B verify cost against the old kernels (rounds alternating), the
    # speculative suite (greedy identity), the Q6_K sweep (the "mmv" column is the new kernel),
    # then session 28's unfinished t_backend_models
    echo "t_gpu_mmq mmv: $(timeout 150 devbin/t_gpu_mmq --test-threads 1 --nocapture mmv_ 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|checked +Q6_K" | head -10 | tr '\n' ' ')"
    echo "== checks $(el)"
    wait $SP
    for r in 1 2; do
        for v in X=1 REDLINE_MMV_Q6K=0; do
            echo "verify $v: $(env $v timeout 100 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,3,4 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | tr -s ' ' | tr '\n' ' ')"
        done
    done
    echo "== verify $(el)"
    echo "t_gpu_speculative: $(timeout 200 devbin/t_gpu_speculative --ignored --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|differs" | head -4 | tr '\n' ' ')"
    echo "== spec $(el)"
    MMV2_SWEEP_TYPES=Q6_K MMV2_SWEEP_COUNTS=1,2,3,4 MMV2_SWEEP_SHAPES=5120x17408,248320x5120,5120x27648 \
        timeout 100 devbin/t_gpu_mmq --ignored --test-threads 1 --nocapture mmv2_timing >"$OUT/q6_sweep.txt" 2>&1
    grep -E "^ *q6_K|Q6_K|panicked" "$OUT/q6_sweep.txt" | grep -v " w[0-9]m" | head -20
    echo "== sweep $(el)"
    echo "t_backend_models: $(timeout 240 devbin/t_backend_models --ignored --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked" | head -4 | tr '\n' ' ')"
    echo "== s29a $(el)"
    ;;
s28d)
    # session 28: the direct Q4_0 kernels (mvd_q4_0_*): the matvec suite (the direct kernels
    # against the CPU reference, Q4_0 now among them), one row and two streams of the 32B Q4_0
    # file against REDLINE_MV_DIRECT_Q4_0=0 (the staged kernels), the GPU suites at this binary,
    # then the 27B Q4_0 file (short of device time: what matters first, first)
    echo "t_gpu_matvec: $(timeout 200 devbin/t_gpu_matvec --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|failures so far" | grep -E "Q4_0|result|FAIL|panic" | tail -9 | tr '\n' ' ')"
    echo "== checks $(el)"
    ab() {
        $R synth --shape $1 --type Q4_0 -o /tmp/q.gguf >/dev/null 2>>"$OUT/err.txt"
        for r in 1 2; do
            for v in X=1 REDLINE_MV_DIRECT_Q4_0=0; do
                ST=$v b q -n 128 -r 2
                [ $r = 2 ] || ST=$v b q -n 64 -r 2 --parallel 2
            done
        done
        rm -f /tmp/q.gguf
        echo "== $1 $(el)"
    }
    ab qwen2.5-32b
    for t in "t_gpu_speculative --ignored" "t_gpu_decode" "t_backend_models" "t_backend_conformance --ignored"; do
        echo "$t: $(timeout 200 devbin/$t --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked" | head -4 | tr '\n' ' ')"
    done
    echo "== suites $(el)"
    ab qwen3.5-27b
    ;;
s28c)
    # session 28: issue 4's table with the current defaults on every model it names (the two
    # shapes at Q4_K_M, IQ4_XS and Q4_0; pp512 and tg128, and tg128 after 4096 tokens for the
    # Q4_K_M files), one model file at a time beside the two Q4_K_M ones (disk), and the per-op
    # profile of a one-row 32B Q4_0 step
    wait $SP
    t() { echo "$1: $(timeout 150 $R bench --device cuda -m /tmp/$1.gguf "${@:2}" 2>>"$OUT/err.txt" | grep -E '^\| qwen' | cut -d'|' -f6- | tr -s ' ' | tr '\n' ' ')"; }
    for m in m32 m27; do
        t $m -p 512 -n 128 -r 2
        t $m -p 0 -n 128 -r 2 -d 4096
    done
    echo "== q4_k_m $(el)"
    for shape in qwen2.5-32b qwen3.5-27b; do
        for ty in IQ4_XS Q4_0; do
            f=/tmp/x.gguf
            $R synth --shape $shape --type $ty -o $f >/dev/null 2>>"$OUT/err.txt"
            echo -n "$shape $ty "
            t x -p 512 -n 128 -r 2
            if [ $shape = qwen2.5-32b ] && [ $ty = Q4_0 ]; then
                REDLINE_PROFILE_OPS=1 timeout 100 $R bench --device cuda -m $f -p 0 -n 16 -r 1 >"$OUT/prof1_q32_q4_0.txt" 2>&1
                grep -A12 'op profile' "$OUT/prof1_q32_q4_0.txt"
            fi
            rm -f $f
        done
    done
    echo "== s28c $(el)"
    ;;
s28b)
    # session 28, window 2: where Q6_K on mmv2 from one token (REDLINE_MMV2_MIN_Q6K=1) loses a
    # one-row step (s28a: 32B -2 %, 27B -0.6..-1.2 %) and where REDLINE_FUSED_Q8K=1 with it loses
    # 10 %: eager per-op profiles of one-row steps (REDLINE_PROFILE_OPS=1)
    wait $SP
    for m in m27 m32; do
        for v in X=1 REDLINE_MMV2_MIN_Q6K=1 "REDLINE_MMV2_MIN_Q6K=1 REDLINE_FUSED_Q8K=1"; do
            f="$OUT/prof1_${m}_$(echo "$v" | tr -c 'A-Za-z0-9\n' _ | cut -c1-40).txt"
            env $v REDLINE_PROFILE_OPS=1 timeout 100 $R bench --device cuda -m /tmp/$m.gguf -p 0 -n 16 -r 1 >"$f" 2>&1
            echo "$m $v: $(grep -E 'op profile' "$f")"
            grep -A14 'op profile' "$f" | tail -13
        done
    done
    echo "== s28b $(el)"
    ;;
s28a)
    # session 28, window 1: session 27's final default on the card (the matvec and speculative
    # suites, the 27B verify cost by default and with REDLINE_MMV2_MIN_Q6K=1), x just in time at
    # one token (devbin/k_xj1: the bit-for-bit check, one row of both models, rounds
    # alternating), and Q6_K's one-token products on mmv2 against the dp4a matvec at the 27B's
    # and 32B's Q6_K shapes (the sweep, 1 / 2 / 4 tokens)
    K=REDLINE_KERNEL_DIR=$PWD/devbin/k_xj1
    echo "t_gpu_matvec: $(timeout 120 devbin/t_gpu_matvec --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked" | head -4 | tr '\n' ' ')"
    echo "t_gpu_matvec xj1: $(env $K timeout 120 devbin/t_gpu_matvec --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|row [0-9]+:" | head -6 | tr '\n' ' ')"
    echo "t_gpu_speculative: $(timeout 200 devbin/t_gpu_speculative --ignored --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|differs" | head -4 | tr '\n' ' ')"
    echo "== checks $(el)"
    MMV2_SWEEP_TYPES=Q6_K MMV2_SWEEP_COUNTS=1,2,4 MMV2_SWEEP_SHAPES=5120x17408,10240x5120,1024x5120,248320x5120,5120x27648,152064x5120 \
        timeout 150 devbin/t_gpu_mmq --ignored --test-threads 1 --nocapture mmv2_timing >"$OUT/q6_sweep.txt" 2>&1
    grep -E "^ *q6_K|Q6_K|panicked" "$OUT/q6_sweep.txt" | grep -v " w[0-9]m" | head -30
    echo "== sweep $(el)"
    wait $SP
    for v in X=1 REDLINE_MMV2_MIN_Q6K=1; do
        echo "verify $v: $(env $v timeout 100 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,3,4 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | tr -s ' ' | tr '\n' ' ')"
    done
    for r in 1 2; do
        for v in X=1 $K; do
            ST=$v b m32 -n 128 -r 2
            ST=$v b m27 -n 128 -r 2
        done
    done
    echo "== s28a $(el)"
    ;;
xj1)
    # written in session 27, not yet run: x just in time at one token too (the direct Q4_K /
    # IQ4_XS kernels: mvd_q4_k_n1_r2 93 -> 75 registers, 5 -> 6 blocks an SM; IQ4_XS 80 -> 64, 6
    # -> 8). Make the variant before packing:
    #   mkdir -p devbin/k_xj1 && sed 's/constexpr bool XJ = NT == 2;/constexpr bool XJ = NT <= 2;/' \
    #       crates/cuda/kernels/matvec_direct.cu > devbin/k_xj1/matvec_direct.cu
    # then one row of both models and two streams of the 27B against the built-in, rounds
    # alternating, and the bit-for-bit check with the variant
    K=REDLINE_KERNEL_DIR=$PWD/devbin/k_xj1
    echo "t_gpu_matvec xj1: $(env $K timeout 120 devbin/t_gpu_matvec --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|row [0-9]+:" | head -6 | tr '\n' ' ')"
    wait $SP
    for r in 1 2; do
        for v in X=1 $K; do
            ST=$v b m32 -n 128 -r 2
            ST=$v b m27 -n 128 -r 2
        done
    done
    echo "== xj1 $(el)"
    ;;
s27i)
    # session 27's last binary (x just in time in the direct two-token kernel, the default):
    # the matvec and speculative suites, the 27B verify cost, two streams of both models
    echo "t_gpu_matvec: $(timeout 120 devbin/t_gpu_matvec --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked" | head -4 | tr '\n' ' ')"
    echo "t_gpu_speculative: $(timeout 200 devbin/t_gpu_speculative --ignored --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|differs" | head -4 | tr '\n' ' ')"
    echo "== checks $(el)"
    wait $SP
    echo "verify: $(timeout 100 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,3,4 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | tr -s ' ' | tr '\n' ' ')"
    b m27 -n 64 -r 2 --parallel 2
    b m32 -n 64 -r 2 --parallel 2
    echo "== s27i $(el)"
    ;;
s27h)
    # session 27: the direct two-token kernel loading x just before each dot (one x buffer, not
    # two: 94 registers, 5 blocks an SM) in devbin/k_xj against the built-in: the bit-for-bit
    # check, the segment timing, the 27B verify cost and two streams, rounds alternating
    K=REDLINE_KERNEL_DIR=$PWD/devbin/k_xj
    echo "t_gpu_matvec xj: $(env $K timeout 120 devbin/t_gpu_matvec --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|row [0-9]+:" | head -6 | tr '\n' ' ')"
    for v in X=1 $K; do
        echo "timing $v:"
        env $v TIMING_SHAPES=down,out,gate/up,in-proj timeout 100 devbin/t_gpu_matvec --ignored few_token_segment_timing --nocapture --test-threads 1 2>&1 | grep -E "q4_K" | head -20
    done
    echo "== timing $(el)"
    wait $SP
    for r in 1 2; do
        for v in X=1 $K; do
            echo "verify $v: $(env $v timeout 100 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | tr -s ' ' | tr '\n' ' ')"
            ST=$v b m27 -n 64 -r 2 --parallel 2
        done
    done
    echo "== s27h $(el)"
    ;;
s27g)
    # session 27's final binary: the speculative suite (with the new check on the kernels a
    # speculating run sets), the matvec suite, the 27B verify cost twice, one row of both models
    echo "t_gpu_speculative: $(timeout 200 devbin/t_gpu_speculative --ignored --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|differs" | head -4 | tr '\n' ' ')"
    timeout 200 devbin/t_gpu_speculative --ignored --test-threads 1 --nocapture speculation_kernels 2>&1 | grep -E "row [0-9] vs|self-draft|distinct" | head -20
    echo "t_gpu_matvec: $(timeout 120 devbin/t_gpu_matvec --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked" | head -4 | tr '\n' ' ')"
    echo "== checks $(el)"
    wait $SP
    for r in 1 2; do
        echo "verify: $(timeout 100 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,3,4 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)|products on' | tr -s ' ' | tr '\n' ' ')"
    done
    b m32 -n 128 -r 2
    b m27 -n 128 -r 2
    echo "== s27g $(el)"
    ;;
s27f)
    # session 27: what Q6_K on mmv2 from one token costs a plain one-row step, and whether the
    # mmv2 K split (its 5120-row launches in 2 or 4 parts) takes it back: rounds alternating
    wait $SP
    for r in 1 2; do
        for v in X=1 REDLINE_MMV2_MIN_Q6K=1 "REDLINE_MMV2_MIN_Q6K=1 REDLINE_MMV2_KSPLIT=2" "REDLINE_MMV2_MIN_Q6K=1 REDLINE_MMV2_KSPLIT=4"; do
            ST=$v b m32 -n 128 -r 2
            ST=$v b m27 -n 128 -r 2
        done
    done
    echo "== s27f $(el)"
    ;;
s27e)
    # session 27: Q6_K on the mmv2 kernels from one token (REDLINE_MMV2_MIN_Q6K=1), so that a
    # speculating run's verify passes keep Q6_K there (cuda::mmv::set_speculation): one row of
    # both models and the 27B verify cost against the default, rounds alternating; the speculative
    # suite with it
    echo "t_gpu_speculative Q6K=1: $(REDLINE_MMV2_MIN_Q6K=1 timeout 150 devbin/t_gpu_speculative --ignored --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|differs" | head -4 | tr '\n' ' ')"
    echo "== checks $(el)"
    wait $SP
    for r in 1 2; do
        for v in X=1 REDLINE_MMV2_MIN_Q6K=1; do
            ST=$v b m27 -n 128 -r 2
            ST=$v b m32 -n 128 -r 2
            echo "verify $v: $(env $v timeout 100 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,3,4 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)|products on' | tr -s ' ' | tr '\n' ' ')"
        done
    done
    echo "== s27e $(el)"
    ;;
s27d)
    # session 27: Q4_K products of 3-4 tokens on the direct kernels for launches under 12288 rows
    # (the default now; REDLINE_MV_DIRECT4=0: the tensor-core mmv kernels as before): checks, the
    # segment timing, mmv / mmv2 / matvec at 3-4 tokens (the sweep's summary), the 27B verify cost
    timeout 120 devbin/t_gpu_matvec --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|row [0-9]+:" | head -8
    for t in t_gpu_mmq t_gpu_decode; do
        echo "$t: $(timeout 150 devbin/$t --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|differ by" | head -4 | tr '\n' ' ')"
    done
    echo "t_gpu_speculative: $(timeout 150 devbin/t_gpu_speculative --ignored --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|differs" | head -4 | tr '\n' ' ')"
    echo "== checks $(el)"
    timeout 200 devbin/t_gpu_matvec --ignored few_token_segment_timing --nocapture --test-threads 1 2>&1 | grep -vE "^(running|test |$)" | head -40
    MMV2_SWEEP_TYPES=Q6_K,Q4_K MMV2_SWEEP_COUNTS=1,3,4 timeout 200 devbin/t_gpu_mmq --ignored mmv2_timing_vs_matvec_and_mmv --nocapture --test-threads 1 2>&1 | grep -E "^ *(type|q[46]_K) " | head -40
    echo "== timing $(el)"
    wait $SP
    for v in X=1 REDLINE_MV_DIRECT4=0 X=1 REDLINE_MV_DIRECT4=0; do
        echo "verify $v: $(env $v timeout 100 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,3,4 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | tr -s ' ' | tr '\n' ' ')"
    done
    echo "== s27d $(el)"
    ;;
s27c)
    # session 27: where a 27B verify pass of 2 rows still spends its extra time (the per-op
    # profile of k = 1 and k = 2 as s26k), and ncu on the direct Q4_K kernel at one and two tokens
    # (gate/up and in-projections: 2-row launches; eager 27B steps of one and two streams)
    wait $SP
    for k in 1 2; do
        REDLINE_PROFILE_OPS=1 timeout 150 $R verify-bench -m /tmp/m27.gguf --device cuda -k $k -d 256 -r 3 >"$OUT/verify_profile_k$k.txt" 2>&1
        grep -E '^\| (decode|verify)|op profile' "$OUT/verify_profile_k$k.txt"
        grep -vE '^\|' "$OUT/verify_profile_k$k.txt" | grep -A34 "^op " | cut -c1-110
    done
    echo "== profile $(el)"
    NCU=/usr/local/cuda/bin/ncu
    for kp in "mvd_q4_k_n1_r2 1" "mvd_q4_k_n2_r2 2"; do
        read -r k par <<<"$kp"
        REDLINE_CUDA_GRAPHS=0 timeout 200 $NCU -k "regex:^$k\$" --launch-skip 12 --launch-count 4 \
            --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
            --section SchedulerStats --section MemoryWorkloadAnalysis -o "$OUT/$k" -f \
            $R bench --device cuda -m /tmp/m27.gguf -p 0 -n 4 -r 1 --parallel $par >"$OUT/ncu_$k.log" 2>&1
        $NCU -i "$OUT/$k.ncu-rep" --page details >"$OUT/det_$k.txt" 2>&1
        rm -f "$OUT/$k.ncu-rep"
        echo "$k:"
        grep -E "^  mv|Duration|Grid Size|Registers Per|Achieved Occupancy|Theoretical Occupancy|DRAM Throughput|Issue Slots Busy|Issued Ipc|L1/TEX Hit|Warp Cycles Per Issued|Eligible Warps|No Eligible" "$OUT/det_$k.txt" | head -60 | cut -c1-150
    done
    echo "== s27c $(el)"
    ;;
s27b)
    # session 27: the direct Q4_K two-token rows per warp chosen by waves (the default now),
    # the Q6_K few-token kernels capped, the direct kernels at 3-4 tokens (REDLINE_MV_DIRECT4=1):
    # checks, the segment timing at 1-4 tokens (built-in, devbin/k_base), the 27B verify cost
    # per variant, two streams of both models
    timeout 120 devbin/t_gpu_matvec --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|row [0-9]+:" | head -8
    REDLINE_MV_DIRECT4=1 timeout 120 devbin/t_gpu_matvec --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|row [0-9]+:" | head -8
    echo "t_gpu_mmq: $(timeout 150 devbin/t_gpu_mmq --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked" | head -4 | tr '\n' ' ')"
    for v in X=1 REDLINE_MV_DIRECT4=1; do
        echo "t_gpu_speculative $v: $(env $v timeout 150 devbin/t_gpu_speculative --ignored --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|differs" | head -4 | tr '\n' ' ')"
    done
    echo "== checks $(el)"
    for k in builtin devbin/k_base; do
        echo "timing kernels $k:"
        if [ $k = builtin ]; then kv=X=1; else kv=REDLINE_KERNEL_DIR=$PWD/$k; fi
        env $kv timeout 200 devbin/t_gpu_matvec --ignored few_token_segment_timing --nocapture --test-threads 1 2>&1 | grep -vE "^(running|test |$)|REDLINE_KERNEL_DIR" | head -40
    done
    echo "== timing $(el)"
    wait $SP
    for v in X=1 REDLINE_MV_DIRECT_R2=2 REDLINE_MV_DIRECT4=1 "REDLINE_MV_DIRECT4=1 REDLINE_MV_DIRECT_R=1" REDLINE_KERNEL_DIR=$PWD/devbin/k_base X=1; do
        echo "verify $v: $(env $v timeout 100 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,3,4 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | tr -s ' ' | tr '\n' ' ')"
    done
    for v in X=1 REDLINE_MV_DIRECT_R2=2 X=1 REDLINE_MV_DIRECT_R2=2; do
        ST=$v b m27 -n 64 -r 2 --parallel 2
        ST=$v b m32 -n 64 -r 2 --parallel 2
    done
    echo "== s27b $(el)"
    ;;
s27a)
    # session 27: the two-token products of the 5120-row shapes (issue 8's verify pass): the
    # suites first (the argmax kernel's total order, the mmq dispatch, the new bit-for-bit check of
    # two-token rows against one-token rows), then the segment timing per rows-per-warp variant
    # with the built-in kernels (Q6_K two-token kernels capped to 3 / 4 blocks an SM),
    # devbin/k_base (session 26's, uncapped) and devbin/k_d5 (the direct Q4_K two-token r2
    # kernel capped to 5 blocks), and the 27B verify cost per variant (REDLINE_MV_R2, the staged
    # kernels' two-token rows per warp, was removed after this window: 2 rows lost)
    timeout 120 devbin/t_gpu_matvec --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|row [0-9]+:" | head -8
    echo "t_backend_conformance: $(timeout 90 devbin/t_backend_conformance --ignored --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked" | head -4 | tr '\n' ' ')"
    for t in t_gpu_mmq t_gpu_decode t_gpu_attention; do
        echo "$t: $(timeout 150 devbin/$t --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|differ by" | head -4 | tr '\n' ' ')"
    done
    echo "== checks $(el)"
    for k in builtin devbin/k_base devbin/k_d5; do
        echo "timing kernels $k:"
        if [ $k = builtin ]; then kv=X=1; else kv=REDLINE_KERNEL_DIR=$PWD/$k; fi
        env $kv timeout 150 devbin/t_gpu_matvec --ignored two_token_segment_timing --nocapture --test-threads 1 2>&1 | grep -vE "^(running|test |$)|REDLINE_KERNEL_DIR" | head -40
    done
    echo "== timing $(el)"
    wait $SP
    for v in X=1 REDLINE_KERNEL_DIR=$PWD/devbin/k_base REDLINE_KERNEL_DIR=$PWD/devbin/k_d5 REDLINE_MV_DIRECT_R2=4 REDLINE_MV_DIRECT_R2=1 REDLINE_MV_R2=2 "REDLINE_MV_DIRECT_R2=4 REDLINE_MV_R2=2" X=1; do
        echo "verify $v: $(env $v timeout 100 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,3 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | tr -s ' ' | tr '\n' ' ')"
    done
    echo "== s27a $(el)"
    ;;
s26n)
    # session 26's last window: Q6_K two-token products on mmv2 by default, verify-bench on
    # speculation's kernels: the mmv2 and speculative suites, two streams of both models, the
    # 27B verify cost (and with REDLINE_MMV2=1: the tensor-core kernels verify-bench ran on before)
    timeout 120 devbin/t_gpu_mmq --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked" | head -4
    timeout 100 devbin/t_gpu_speculative --ignored --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked" | head -4
    echo "== checks $(el)"
    wait $SP
    for m in m32 m27; do b $m -n 64 -r 2 --parallel 2; done
    for v in X=1 REDLINE_MMV2=1; do
        echo "verify $v:"
        env $v timeout 100 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,3,4 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | head -6
    done
    echo "== s26n $(el)"
    ;;
s26m)
    # session 26: Q6_K two-token products on mmv2 (REDLINE_MMV2_MIN_Q6K=2) beyond the 27B's
    # verify pass: two streams of both models, one row of the 32B, rounds alternating
    wait $SP
    for r in 1 2; do
        for v in X=1 REDLINE_MMV2_MIN_Q6K=2; do
            ST=$v b m32 -n 64 -r 2 --parallel 2
            ST=$v b m27 -n 64 -r 2 --parallel 2
        done
    done
    echo "== s26m $(el)"
    ;;
s26l)
    # session 26: the 27B verify cost (k = 1, 2) under the existing two-token switches, rounds
    # alternating: x in shared memory off, Q6_K two-token products on mmv2 (with a K split)
    wait $SP
    for r in 1 2; do
        for v in X=1 REDLINE_MV_XSMEM=0 REDLINE_MMV2_MIN_Q6K=2 "REDLINE_MMV2_MIN_Q6K=2 REDLINE_MMV2_KSPLIT=2"; do
            echo "verify $v: $(env $v timeout 100 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify k=2)' | cut -d'|' -f3,4 | tr '\n' ' ')"
        done
    done
    echo "== s26l $(el)"
    ;;
s26k)
    # session 26: issue 8's verify pass of 2 rows against 1, op by op (REDLINE_PROFILE_OPS=1,
    # one verify-bench run per k: each table mixes its decode steps and its verify passes)
    wait $SP
    for k in 1 2; do
        REDLINE_PROFILE_OPS=1 timeout 150 $R verify-bench -m /tmp/m27.gguf --device cuda -k $k -d 256 -r 3 >"$OUT/verify_profile_k$k.txt" 2>&1
        grep -E '^\| (decode|verify)|op profile' "$OUT/verify_profile_k$k.txt"
        grep -vE '^\|' "$OUT/verify_profile_k$k.txt" | grep -A28 "^op " | cut -c1-100
    done
    echo "== s26k $(el)"
    ;;
s26j)
    # session 26: the top-k path with the merge on the device (topk_merge_f32) and 8 loads in
    # flight in topk_parts_f32: the conformance check, its time per call (REDLINE_TOPK_LOG=1),
    # then issue 6's serve rows at temperature 0.8 and greedy
    timeout 90 devbin/t_backend_conformance --ignored --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked" | head -4
    wait_m32
    rm -f /tmp/serve_load.py
    export BENCH_TEMPERATURE=0.8
    TOKENS=128 serve_rows p32c 32 1,8 REDLINE_STEP_LOG=1 REDLINE_TOPK_LOG=1
    python3 scripts/steplog-summary.py /tmp/serve_p32c.log 2>&1 | tail -2
    for r in 1 8; do
        grep "top-k rows=$r " /tmp/serve_p32c.log | tail -200 | python3 -c "
import sys, re
v = [float(re.findall(r'([\d.]+) ms', l)[-1]) for l in sys.stdin]
if v:
    print('rows $r:', len(v), 'calls; mean %.3f ms' % (sum(v) / len(v)))
"
    done
    TOKENS=256 serve_rows p32d 32 1,8 REDLINE_STEP_LOG=1
    python3 scripts/steplog-summary.py /tmp/serve_p32d.log 2>&1 | tail -2
    unset BENCH_TEMPERATURE
    TOKENS=256 serve_rows p32 32 1,8 REDLINE_STEP_LOG=1
    python3 scripts/steplog-summary.py /tmp/serve_p32.log 2>&1 | tail -2
    echo "== s26j $(el)"
    ;;
s26i)
    # session 26: where the top-k path's 0.45 ms after an 8-row step goes (REDLINE_TOPK_LOG=1:
    # buffer + kernel, copy, merge), temperature 0.8 at 1 / 8 streams
    wait_m32
    rm -f /tmp/serve_load.py
    export BENCH_TEMPERATURE=0.8
    TOKENS=128 serve_rows p32c 32 1,8 REDLINE_STEP_LOG=1 REDLINE_TOPK_LOG=1
    unset BENCH_TEMPERATURE
    python3 scripts/steplog-summary.py /tmp/serve_p32c.log 2>&1 | tail -2
    for r in 1 8; do
        grep "top-k rows=$r " /tmp/serve_p32c.log | tail -200 | python3 -c "
import sys, re
v = [list(map(float, re.findall(r'([\d.]+) ms', l))) for l in sys.stdin]
v = [x for x in v if len(x) == 3]
if v:
    print('rows $r:', len(v), 'calls; mean buffer+kernel %.3f copy %.3f merge %.3f ms' % tuple(sum(c) / len(v) for c in zip(*v)))
"
    done
    echo "== s26i $(el)"
    ;;
s26h)
    # session 26's final binary: the top-k check, issue 6's serve rows (greedy at 1 / 8 / 32
    # streams, temperature 0.8 at 1 / 8), the one-row bench of both models (issue 4), 8 rows,
    # and issue 8's verify cost
    timeout 90 devbin/t_backend_conformance --ignored --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked" | head -4
    echo "== checks $(el)"
    wait $SP
    rm -f /tmp/serve_load.py
    TOKENS=256 serve_rows p32 32 1,8 REDLINE_STEP_LOG=1
    python3 scripts/steplog-summary.py /tmp/serve_p32.log 2>&1 | tail -2
    TOKENS=128 serve_rows p32b 32 32
    export BENCH_TEMPERATURE=0.8
    TOKENS=256 serve_rows p32c 32 1,8 REDLINE_STEP_LOG=1
    python3 scripts/steplog-summary.py /tmp/serve_p32c.log 2>&1 | tail -2
    unset BENCH_TEMPERATURE
    echo "== serve $(el)"
    for m in m32 m27; do b $m -n 128 -r 3; b $m -n 32 -r 2 --parallel 8; done
    timeout 150 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,3,4 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | head -8
    echo "== s26h $(el)"
    ;;
s26g)
    # session 26: top-k sampling from device-selected candidates (topk_parts_f32): the
    # conformance suite, then issue 6's serve rows greedy, at temperature 0.8 (the server's
    # top-k 40) and at 0.8 with REDLINE_DEVICE_SAMPLING=0 (whole rows to the host)
    echo "t_backend_conformance: $(timeout 90 devbin/t_backend_conformance --ignored --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked" | head -4 | tr '\n' ' ')"
    timeout 90 devbin/t_backend_conformance --ignored --test-threads 1 top_k 2>&1 | grep -E "panicked|top_k_cols" | head -3
    echo "== checks $(el)"
    wait_m32
    rm -f /tmp/serve_load.py  # (an older copy has no BENCH_TEMPERATURE)
    for v in "X=1 BENCH_TEMPERATURE=0" "X=1 BENCH_TEMPERATURE=0.8" "REDLINE_DEVICE_SAMPLING=0 BENCH_TEMPERATURE=0.8"; do
        echo "serve variant: $v"
        export ${v#* }
        TOKENS=256 serve_rows p32 32 1,8 REDLINE_STEP_LOG=1 $v
        python3 scripts/steplog-summary.py /tmp/serve_p32.log 2>&1 | tail -3
    done
    unset BENCH_TEMPERATURE
    echo "== s26g $(el)"
    ;;
s26f)
    # session 26: batched decode storing the new K/V in the decode kernel (fa_decode_store_*,
    # REDLINE_DECODE_STORE=0: the mo_kv_store2 launch before it): the suites, 8 rows of the
    # 32B and 27B with and without, rounds alternating, then issue 6's serve rows (twice)
    for t in t_gpu_attention t_gpu_decode; do
        echo "$t: $(timeout 150 devbin/$t --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|differ by" | head -4 | tr '\n' ' ')"
    done
    for t in t_backend_conformance t_gpu_speculative; do
        echo "$t: $(timeout 100 devbin/$t --ignored --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked" | head -4 | tr '\n' ' ')"
    done
    echo "== checks $(el)"
    wait $SP
    for r in 1 2; do
        for v in X=1 REDLINE_DECODE_STORE=0; do
            ST=$v b m32 -n 32 -r 2 --parallel 8
            ST=$v b m27 -n 32 -r 2 --parallel 8
        done
    done
    b m32 -n 128 -r 2
    echo "== bench $(el)"
    for r in 1 2; do
        TOKENS=256 serve_rows p32 32 1,8 REDLINE_STEP_LOG=1
        python3 scripts/steplog-summary.py /tmp/serve_p32.log 2>&1 | tail -3
    done
    echo "== s26f $(el)"
    ;;
s26e)
    # session 26: where to cut recorded steps (REDLINE_STEP_SPLITS: 0 none, 2, 2,8,32 (the
    # default), 4, 1,4): one and eight rows, rounds alternating; then serve rows with the
    # device-side greedy pick alone (splits off) and with splits at 2 only
    wait_m32
    for r in 1 2; do
        for v in 0 2 2,8,32 1,4; do
            ST=REDLINE_STEP_SPLITS=$v b m32 -n 128 -r 2
            ST=REDLINE_STEP_SPLITS=$v b m32 -n 32 -r 2 --parallel 8
        done
    done
    echo "== bench $(el)"
    for v in REDLINE_STEP_SPLITS=0 REDLINE_STEP_SPLITS=2; do
        echo "serve variant: $v"
        TOKENS=256 serve_rows p32 32 1,8 REDLINE_STEP_LOG=1 $v
        python3 scripts/steplog-summary.py /tmp/serve_p32.log 2>&1 | tail -3
    done
    echo "== s26e $(el)"
    ;;
s26d)
    # (s26c's measurements)
    wait_m32
    for r in 1 2; do
        for v in X=1 REDLINE_STEP_SPLITS=0; do
            ST=$v b m32 -n 128 -r 2
            ST=$v b m32 -n 32 -r 2 --parallel 8
        done
    done
    echo "== bench $(el)"
    for v in X=1 "REDLINE_DEVICE_GREEDY=0 REDLINE_STEP_SPLITS=0"; do
        echo "serve variant: $v"
        TOKENS=256 serve_rows p32 32 1,8 REDLINE_STEP_LOG=1 $v
        cp /tmp/serve_p32.log "$OUT/serve_steplog_$(echo $v | tr -dc 'A-Z0-9')".log
        grep -iE "segmentation|panicked" /tmp/serve_p32.log | tail -2
        python3 scripts/steplog-summary.py /tmp/serve_p32.log 2>&1 | tail -12
    done
    # 512 positions a slot (-c 16384): decode attention launches 8 splits a row, not 32
    echo "serve variant: default, CTX_PER_SLOT=512"
    CTX_PER_SLOT=512 TOKENS=256 serve_rows p32 32 1,8 REDLINE_STEP_LOG=1
    python3 scripts/steplog-summary.py /tmp/serve_p32.log 2>&1 | tail -3
    echo "== s26d $(el)"
    ;;
s26b)
    # session 26: ncu's duration of every kernel of a few layers of eager 32B steps: 8 rows at
    # d0 and d384, one row at d384 (which kernels an 8-row step's attention runs, and the merge)
    wait_m32
    NCU=/usr/local/cuda/bin/ncu
    for a in "-d 0 --parallel 8" "-d 384 --parallel 8" "-d 384"; do
        f="$OUT/ncu_all_$(echo $a | tr -dc '0-9a-z')".csv
        REDLINE_CUDA_GRAPHS=0 timeout 200 $NCU --launch-skip ${SKIP:-4000} --launch-count ${COUNT:-60} \
            --metrics gpu__time_duration.sum --csv \
            $R bench --device cuda -m /tmp/m32.gguf -p 0 -n 8 -r 1 $a >"$f" 2>&1
        echo "ncu $a:"
        python3 - "$f" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if not rows:
    print("no rows"); sys.exit()
h = rows[0]
ki, gi, bi, vi = h.index("Kernel Name"), h.index("Grid Size"), h.index("Block Size"), h.index("Metric Value")
agg = collections.defaultdict(list)
for r in rows[1:]:
    agg[(r[ki].split("(")[0][:30], r[gi], r[bi])].append(float(r[vi].replace(",", "")) / 1000)
tot = sum(sum(v) for v in agg.values())
for k, v in sorted(agg.items(), key=lambda kv: -sum(kv[1])):
    print(f"  {k[0]:30} grid {k[1]:14} blk {k[2]:12} n={len(v):3} mean {sum(v)/len(v):8.2f} us min {min(v):7.2f} max {max(v):7.2f}  {100*sum(v)/tot:5.1f}%")
PY
    done
    echo "== s26b $(el)"
    ;;
s26a)
    # session 26: where an 8-row step's attention time goes at depth (1.46 ms a step at d384
    # against 0.74 at d0): per-op device time (REDLINE_PROFILE_OPS=1) at 8 rows d0 / d384 and
    # one row d384, then ncu's duration of each fa_decode_fused_d128 / fa_merge_active launch
    # in eager 8-row steps at d0 and d384 (kernels serialized: no PDL overlap)
    wait_m32
    for a in "-d 0 --parallel 8" "-d 384 --parallel 8" "-d 384"; do
        echo "== profile $a $(el)"
        REDLINE_PROFILE_OPS=1 timeout 150 $R bench --device cuda -m /tmp/m32.gguf -p 0 -n 16 -r 1 $a 2>&1 |
            grep -E "op profile|^attention|^rope|^matmul|^\| qwen" | cut -c1-110 | head -14
    done
    NCU=/usr/local/cuda/bin/ncu
    for d in 0 384; do
        REDLINE_CUDA_GRAPHS=0 timeout 200 $NCU -k "regex:fa_decode_fused|fa_merge_active" --launch-skip 640 \
            --launch-count 24 --metrics gpu__time_duration.sum,dram__bytes_read.sum,sm__cycles_active.avg --csv \
            $R bench --device cuda -m /tmp/m32.gguf -p 0 -n 8 -r 1 -d $d --parallel 8 >"$OUT/ncu_d$d.csv" 2>&1
        echo "ncu d$d:"
        python3 - "$OUT/ncu_d$d.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if not rows:
    print("no rows"); sys.exit()
h = rows[0]
ki, gi, mi, vi = h.index("Kernel Name"), h.index("Grid Size"), h.index("Metric Name"), h.index("Metric Value")
agg = collections.defaultdict(list)
for r in rows[1:]:
    agg[(r[ki][:24], r[gi], r[mi])].append(float(r[vi].replace(",", "")))
for k, v in sorted(agg.items()):
    print(f"  {k[0]:24} grid {k[1]:14} {k[2]:28} n={len(v):3} mean {sum(v)/len(v):12.1f} min {min(v):10.1f} max {max(v):10.1f}")
PY
    done
    echo "== s26a $(el)"
    ;;
s25f)
    # session 25's last window: the suites whose logits now come down through the page-locked
    # buffer (download_cols): speculative, models, DeltaNet, attention, decode, conformance.
    for t in t_gpu_speculative t_backend_models t_gpu_deltanet t_gpu_attention t_gpu_decode; do
        echo "$t: $(timeout 100 devbin/$t --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked" | head -4 | tr '\n' ' ')"
    done
    echo "t_backend_conformance: $(timeout 60 devbin/t_backend_conformance --ignored --test-threads 1 2>&1 | grep -E "test result|panicked" | head -3 | tr '\n' ' ')"
    echo "== s25f $(el)"
    ;;
s25e)
    # session 25: logits cut on the way to the host (download_cols: one strided copy): the
    # conformance suite on the card (its new download_cols check), then the server's 1 / 8
    # streams with the step log (the model call after the device is done: 0.66 ms at 8 rows
    # before), 32 streams.
    timeout 200 devbin/t_backend_conformance --ignored --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked" | head -8
    timeout 240 devbin/t_gpu_decode --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|differ by" | head -8
    echo "== checks $(el)"
    wait_m32
    b m32 -n 128 -r 2
    b m32 -n 32 -r 2 --parallel 8
    TOKENS=256 serve_rows p32 32 1,8 REDLINE_STEP_LOG=1
    cp /tmp/serve_p32.log "$OUT/serve8_steplog.log"
    grep -iE "segmentation|panicked|exiting" /tmp/serve_p32.log | tail -2
    TOKENS=128 serve_rows p32b 32 32
    echo "== s25e $(el)"
    ;;
s25d)
    # session 25: the 27B fused test with the unfused f32 few-token products on the fused
    # path's kernel, the conformance suite, the 8-stream server's steps with the step log
    # (model call vs device completion: what the download and the logits cut cost), and issue
    # 8's verify cost with the direct two-token kernels.
    timeout 240 devbin/t_gpu_decode --test-threads 1 >/tmp/dec.txt 2>&1; grep -E "^test .*(FAIL|panic)|test result|panicked|differ by" /tmp/dec.txt | head -12
    timeout 60 devbin/t_gpu_decode --exact fused_matches_unfused_on_synth_q4_k_m_shapes --nocapture 2>&1 | grep -E "max relative|differ by"
    timeout 200 devbin/t_backend_conformance --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked" | head -8
    echo "== checks $(el)"
    wait_m32
    TOKENS=256 serve_rows p32 32 1,8 REDLINE_STEP_LOG=1
    cp /tmp/serve_p32.log "$OUT/serve8_steplog.log"
    grep -iE "segmentation|panicked|exiting" /tmp/serve_p32.log | tail -2
    echo "== serve $(el)"
    while [ ! -e /tmp/synth.done ] && kill -0 $SP 2>/dev/null; do sleep 1; done
    timeout 200 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2,3,4 -d 256 -r 3 2>&1 | grep -E "^\|" | tail -8
    echo "== s25d $(el)"
    ;;
s25c)
    # session 25: which 27B op keeps fused and unfused apart (the 1.5B is bit-exact; the 27B
    # differs by ~1.05e-4 against the test's 1e-4): the test under each switch, its max diff;
    # then what attention costs an 8-row step at depth 384 (REDLINE_SKIP_OPS, graph mode) and
    # one decode split per 32 positions (REDLINE_FA_TILES_PER_SPLIT=1).
    for v in X=1 REDLINE_MV_DIRECT=0 REDLINE_MMV2_N=0 REDLINE_FUSED_GATES=0 REDLINE_FUSED_NORM_Q8=0 REDLINE_FUSED_ATTN_Q8=0 \
        REDLINE_FUSED_CONV_ROWS=0 REDLINE_FUSED_ATTN_ROWS=0 REDLINE_FUSED_CONV=0 REDLINE_FUSED_ATTENTION=0 REDLINE_DN_PDL=0 \
        REDLINE_Q8_1_TILED=0 REDLINE_PDL=0 REDLINE_FLASH_ATTN=0; do
        echo "$v: $(env $v timeout 60 devbin/t_gpu_decode --exact fused_matches_unfused_on_synth_q4_k_m_shapes --nocapture 2>&1 | grep -oE "qwen3.5-27b: [^|]*(max relative .diff. [0-9.e-]+|differ by [0-9.e-]+)" | head -1) rc=$?"
    done
    echo "== bisect $(el)"
    wait_m32
    for t in 1 2; do ST="REDLINE_FA_TILES_PER_SPLIT=$t" b m32 -d 384 -n 32 -r 2 --parallel 8; done
    ST="REDLINE_SKIP_OPS=attention" b m32 -d 384 -n 32 -r 2 --parallel 8
    b m32 -n 32 -r 2 --parallel 8
    ST="REDLINE_SKIP_OPS=attention" b m32 -n 32 -r 2 --parallel 8
    b m32 -d 384 -n 64 -r 2
    ST="REDLINE_SKIP_OPS=attention" b m32 -d 384 -n 64 -r 2
    echo "== s25c $(el)"
    ;;
s25b)
    # session 25: the unfused one/two-token Q4_K / IQ4_XS products on the direct kernels (the
    # fused test), the matvec suite, the server's stop (a segfault at SIGTERM in s25: the
    # process exited under the scheduler thread), then the 8-row steps at depth 384 by decode
    # split size (REDLINE_FA_TILES_PER_SPLIT; 2 is the default), and one row for reference.
    timeout 240 devbin/t_gpu_decode --test-threads 1 >/tmp/dec.txt 2>&1; grep -E "^test .*(FAIL|panic)|test result|panicked|differ by" /tmp/dec.txt | head -12
    timeout 200 devbin/t_gpu_matvec --test-threads 1 >/tmp/mv.txt 2>&1; grep -E "^test .*(FAIL|panic)|test result|panicked" /tmp/mv.txt | head -12
    echo "== checks $(el)"
    wait_m32
    TOKENS=256 serve_rows p32 32 1,8
    grep -iE "segmentation|panicked|generation thread|exiting" /tmp/serve_p32.log | tail -3
    echo "== serve $(el)"
    for t in 2 4 8 16; do ST="REDLINE_FA_TILES_PER_SPLIT=$t" b m32 -d 384 -n 32 -r 2 --parallel 8; done
    for t in 2 8; do ST="REDLINE_FA_TILES_PER_SPLIT=$t" b m32 -d 384 -n 64 -r 2; done
    REDLINE_PROFILE_OPS=1 timeout 100 $R bench --device cuda -m /tmp/m32.gguf -p 0 -d 384 -n 16 -r 1 --parallel 8 >"$OUT/prof8_d384.txt" 2>&1
    echo "== s25b $(el)"
    ;;
s25)
    # for session 25's first window (any card; meant for the H200): the decode suite (the
    # n-tile segments; fused_matches_unfused failed on the H100 at 1.04e-4 against 1e-4, with
    # and without the n-tiles), the segments check, batched decode at 1 / 8 / 16 / 32 rows,
    # issue 6's serve rows with the malloc fixes (mallopt in main, one arena), then issue 4's
    # table.
    timeout 240 devbin/t_gpu_decode --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked|differ by" | head -12
    timeout 100 devbin/t_gpu_mmq --test-threads 1 mmv2_segments_with 2>&1 | grep -E "^test |result|panicked" | head -4
    echo "== checks $(el)"
    wait_m32
    b m32 -n 128 -r 2
    for n in 8 16 32; do b m32 -n 32 -r 2 --parallel $n; done
    echo "== rows $(el)"
    TOKENS=256 serve_rows p32 32 1,8 REDLINE_STEP_LOG=1
    python3 scripts/steplog-summary.py /tmp/serve_p32.log | grep -E "^\| Replay \| (1|2-8) \| -"
    grep "cuda step timing" /tmp/serve_p32.log | awk '{h+=$5; d+=$14; c++} END {printf "recorded steps: host %.2f ms, device done %.2f ms (mean of %d)\n", h/c, d/c, c}'
    TOKENS=128 serve_rows p32b 32 32
    echo "== s25 $(el)"
    ;;
s24g)
    # session 24: the server's logits cut in place: issue 6's serve rows at 1 and 8 streams
    # (256 tokens) and 32 (128), the 8-row steps by kind.
    wait_m32
    TOKENS=256 serve_rows p32 32 1,8 REDLINE_STEP_LOG=1
    python3 scripts/steplog-summary.py /tmp/serve_p32.log | grep -E "^\| Replay \| (1|2-8) \| -"
    TOKENS=128 serve_rows p32b 32 32
    echo "== s24g $(el)"
    ;;
s24f)
    # session 24: 8 serve streams gave 486 all-streams decode tok/s on the H100 (16.7 ms a step)
    # where the bench's 8 rows give 692 (11.6 ms): the server's steps by kind
    # (REDLINE_STEP_LOG=1), with the n-tile kernels and without.
    wait_m32
    for v in X=1 REDLINE_MMV2_N=0; do
        TOKENS=256 serve_rows p32 32 8 $v REDLINE_STEP_LOG=1
        cp /tmp/serve_p32.log "$OUT/serve8_${v%%=*}.log"
        python3 scripts/steplog-summary.py /tmp/serve_p32.log | head -24
    done
    echo "== s24f $(el)"
    ;;
s24e)
    # session 24: redline keeps freed heap memory (mallopt): batched decode at 8 / 16 / 24 / 32
    # rows and one row, then issue 6's serve rows at 1 and 8 streams (256 tokens) and 32 (128).
    wait_m32
    b m32 -n 128 -r 2
    for n in 8 16 24 32; do b m32 -n 32 -r 2 --parallel $n; done
    echo "== rows $(el)"
    TOKENS=256 serve_rows p32 32 1,8
    TOKENS=128 serve_rows p32b 32 32
    echo "== s24e $(el)"
    ;;
s24d)
    # session 24: gpu_decode's fused_matches_unfused failed with the n-tile segments (its
    # 9-token prompt is a recorded step: segments fused, one matrix a launch unfused): the
    # message, and the control with REDLINE_MMV2_N=0; the segments against the CPU reference
    # (gpu_mmq); then where a 24- and 32-row step's time goes (REDLINE_STEP_LOG=1 times the host
    # walk and the device apart) against 16.
    timeout 100 devbin/t_gpu_mmq --test-threads 1 mmv2_segments_with 2>&1 | grep -E "^test |result|panicked|want" | head -6
    timeout 100 devbin/t_gpu_decode --test-threads 1 --nocapture fused_matches_unfused_on_synth 2>&1 | grep -E "^test |result|panicked|differ|worst" | head -8
    REDLINE_MMV2_N=0 timeout 100 devbin/t_gpu_decode --test-threads 1 fused_matches_unfused_on_synth 2>&1 | grep -E "^test |result" | head -3
    echo "== checks $(el)"
    wait_m32
    for n in 32 24 16; do
        REDLINE_STEP_LOG=1 timeout 100 $R bench --device cuda -m /tmp/m32.gguf -p 0 -n 32 -r 1 --parallel $n >"$OUT/steplog$n.txt" 2>&1
        echo "rows $n: $(grep -E 'rep 1' "$OUT/steplog$n.txt" | head -1) | $(grep 'cuda step timing' "$OUT/steplog$n.txt" | tail -20 | awk '{h+=$5; d+=$14; w+=$19; c++} END {printf "host %.2f ms, device done %.2f ms, opening waited %.2f ms (mean of %d)", h/c, d/c, w/c, c}')"
    done
    echo "== s24d $(el)"
    ;;
s24c)
    # session 24: the n-tile kernels on by default, matmul_many / matmul_add of 9..32 rows as
    # n-tile segments (QKV, gate/up one launch; bias and residual add in the epilogue). The
    # decode suite (n-tiles against mmq in whole steps; batched decode against the CPU), then
    # the step modes at 32 / 16 rows (a 32-row step: 59.5 ms in the bench, 32.3 ms of device
    # time in the eager profile), then 32 / 16 rows against REDLINE_MMV2_N=0 (mmq), graphs
    # and PDL each and both off at 32 rows, 24 rows, the 32-row profile.
    timeout 240 devbin/t_gpu_decode --test-threads 1 2>&1 | grep -E "^test .*(FAIL|panic)|test result|panicked" | head -12
    echo "== checks $(el)"
    wait_m32
    for n in 32 16; do
        REDLINE_STEP_LOG=1 timeout 100 $R bench --device cuda -m /tmp/m32.gguf -p 0 -n 32 -r 1 --parallel $n >"$OUT/steplog$n.txt" 2>&1
        echo "rows $n step modes: $(grep -oE 'cuda step [A-Za-z]+' "$OUT/steplog$n.txt" | sort | uniq -c | tr '\n' ' ')"
        grep -E "not recorded|differs|captured" "$OUT/steplog$n.txt" | sort | uniq -c | head -4
    done
    for n in 32 16; do
        for v in X=1 REDLINE_MMV2_N=0; do ST=$v b m32 -n 32 -r 2 --parallel $n; done
    done
    echo "== rows $(el)"
    for v in REDLINE_CUDA_GRAPHS=0 REDLINE_PDL=0 "REDLINE_CUDA_GRAPHS=0 REDLINE_PDL=0"; do
        ST=$v b m32 -n 32 -r 2 --parallel 32
    done
    b m32 -n 32 -r 2 --parallel 24
    REDLINE_PROFILE_OPS=1 timeout 100 $R bench --device cuda -m /tmp/m32.gguf -p 0 -n 8 -r 1 --parallel 32 >"$OUT/prof32.txt" 2>&1
    sed -n "/op profile/,\$p" "$OUT/prof32.txt" | head -18 | cut -c1-120
    echo "== s24c $(el)"
    ;;
s24b)
    # session 24: where a 32-row step with the n-tile kernels goes (H100 s24: 46.8 ms at 32 rows
    # against 17.6 at 16, the kernel sweep sums to ~17 ms at 32), by the per-op profile at 32
    # and 16 rows, then 4 warps a block for the Q4_K n-tile launches (the sweep's best for the
    # 2176-tile gate/up) at 32 and 16 rows.
    wait_m32
    for n in 32 16; do
        REDLINE_MMV2_N=1 REDLINE_PROFILE_OPS=1 timeout 100 $R bench --device cuda -m /tmp/m32.gguf -p 0 -n 8 -r 1 --parallel $n >"$OUT/prof$n.txt" 2>&1
        sed -n "/op profile/,\$p" "$OUT/prof$n.txt" | head -18 | cut -c1-120
    done
    echo "== profiles $(el)"
    for n in 32 16; do
        for v in REDLINE_MMV2_N=1 "REDLINE_MMV2_N=1 REDLINE_MMV2_Q4_WARPS=4"; do ST=$v b m32 -n 32 -r 2 --parallel $n; done
    done
    echo "== s24b $(el)"
    ;;
s24)
    # session 23: mmv2 with NT tiles of 8 tokens per warp for 9..32-token Q4_K / Q6_K products
    # (REDLINE_MMV2_N=1) against mmq. Checks, then the kernel timing (µs, mmq vs mmv2 by warps),
    # then the 32B at 32 / 16 / 24 rows. Predicted from the SASS (NVRTC 12.4, sm_90: 775
    # instructions per super-block and warp at NT = 4 for 32 IMMAs, against 300 for 8 at NT =
    # 1; 567 after the padded layout): the 32-token Q4_K products ~2.5x faster than mmq's 0.44
    # TB/s (~1 TB/s), the 32-row step 73 -> ~35-40 ms, unless x (160 KB at 5120 columns, 884 KB
    # at 27648, read by every 16-row tile) comes from L2: then the register-fragment kernel
    # (REDLINE_MMV2_STAGE=0: no shared memory for weights, more L1) wins the 5120-wide ones.
    # Then the serve row at 32 streams with it on (SERVE=1).
    timeout 150 devbin/t_gpu_mmq --test-threads 1 mmv2_n_tiles 2>&1 | grep -E "^test |result|panicked|FAIL|checked" | head -12
    timeout 200 devbin/t_gpu_decode --nocapture --test-threads 1 mmv2_n_tiles 2>&1 | grep -E "^test |result|panicked|sequences" | head -8
    echo "== checks $(el)"
    MMV2N_SHAPES=${SHAPES:-} timeout 150 devbin/t_gpu_mmq --ignored --nocapture --test-threads 1 mmv2n_timing 2>&1 | grep -E "^ *(Q|type)|panicked" | head -24
    echo "== timing $(el)"
    wait_m32
    for n in ${ROWS:-32 16}; do
        for v in X=1 REDLINE_MMV2_N=1 "REDLINE_MMV2_N=1 REDLINE_MMV2_STAGE=0"; do ST=$v b m32 -n 32 -r 2 --parallel $n; done
    done
    echo "== rows $(el)"
    [ -z "${SERVE:-}" ] || TOKENS=128 serve_rows p32b 32 32 REDLINE_MMV2_N=1
    echo "== s24 $(el)"
    ;;
s22c)
    # two 16-row tiles a block for 16384+ rows by default (session 22): the 32B at 32 and 16
    # rows against REDLINE_MMQ_MT=1. Run with NO_SYNTH=1 (only the 32B is written here).
    [ -e /tmp/m32.gguf ] || $R synth --shape qwen2.5-32b --type Q4_K_M -o /tmp/m32.gguf >/tmp/s32.log 2>&1
    echo "== synth $(el)"
    for n in 32 16; do
        for v in X=1 REDLINE_MMQ_MT=1; do ST=$v b m32 -n 32 -r 2 --parallel $n; done
    done
    echo "== s22c $(el)"
    ;;
s22b)
    # session 22's last window: mmq's check with two tiles a block (the gpu_mmq tests now set
    # the natural q8_1 layout), the serve rows at 1 / 8 streams (256 tokens) and 32 (128) with
    # the all-streams decode column, mmq's kernel timing with MT = 2 (Q4_K).
    timeout 150 devbin/t_gpu_mmq --test-threads 1 mmq_matches 2>&1 | grep -E "^test |result|panicked|FAIL" | head -8
    echo "== checks $(el)"
    wait $SP
    # the 32-row step: replayed 75 ms in the server, eager ~59-63 ms, the eager profile 56.8:
    # graphs or PDL?
    for v in X=1 REDLINE_CUDA_GRAPHS=0 REDLINE_PDL=0; do ST=$v b m32 -n 32 -r 2 --parallel 32; done
    echo "== graphs $(el)"
    TOKENS=256 serve_rows p32 32 1,8
    TOKENS=128 serve_rows p32b 32 32
    echo "== serve $(el)"
    MMQ_TYPES=q4_K timeout 100 devbin/t_gpu_mmq --ignored --test-threads 1 --nocapture mmq_timing >"$OUT/mmq_timing.txt" 2>&1
    grep -E "^ *q4_K" "$OUT/mmq_timing.txt" | grep -E " (8|16|32) " | head -12
    echo "== s22b $(el)"
    ;;
s32)
    # session 22: why 32 serve streams aggregate less than 8 (session 21: 402.7 against 578.3
    # decode tok/s). Most important first (partial output comes back on a timeout): the checks,
    # batched decode at 16 / 32 rows with and without two tiles a block in mmq, the server's
    # step log (REDLINE_STEP_LOG=1) at 32 streams summarized by step kind, the per-op profile at
    # 32 rows, mmq's kernel timing (MMQT=1), the serve log without the mixed-step batching.
    timeout 200 devbin/t_gpu_mmq --test-threads 1 mmq_matches 2>&1 | grep -E "^test |result|panicked|FAIL" | head -8
    echo "== checks $(el)"
    wait $SP
    for v in X=1 REDLINE_MMQ_MT=2; do
        for n in 16 32; do ST=$v b m32 -n 64 -r 2 --parallel $n; done
    done
    echo "== s32 bench $(el)"
    for v in X=1 ${SERVE_AB:-}; do
        TOKENS=${TOKENS:-128} serve_rows "steplog_${v%%=*}" 32 ${STREAMS:-32} REDLINE_STEP_LOG=1 $v
        python3 scripts/steplog-summary.py "/tmp/serve_steplog_${v%%=*}.log" | tee "$OUT/steplog_${v%%=*}.txt"
        xz -c "/tmp/serve_steplog_${v%%=*}.log" >"$OUT/serve_steplog_${v%%=*}.log.xz"
        echo "== serve $v $(el)"
    done
    REDLINE_PROFILE_OPS=1 timeout 100 $R bench --device cuda -m /tmp/m32.gguf -p 0 -n 16 -r 1 --parallel 32 >"$OUT/prof32.txt" 2>&1
    sed -n "/op profile/,\$p" "$OUT/prof32.txt" | head -28 | cut -c1-120
    echo "== profile $(el)"
    [ -z "${MMQT:-}" ] || MMQ_TYPES=q4_K,q6_K timeout 150 devbin/t_gpu_mmq --ignored --test-threads 1 --nocapture mmq_timing >"$OUT/mmq_timing.txt" 2>&1
    grep -E "^ *q[46]_K" "$OUT/mmq_timing.txt" | grep -E " (8|16|32) " | head -24
    echo "== s32 $(el)"
    ;;
direct)
    # session 21 (written without a device): Q4_K / IQ4_XS one- and two-token segment products
    # with the weights loaded straight into registers (kernels/matvec_direct.cu mvd_*: Q4_K 0.083
    # SASS instructions a weight byte at 4 rows per warp, 0.092 at 2, against the staged
    # kernels' 0.119; IQ4_XS 0.146 against ~0.23). Checks first; then one row, rounds alternating.
    # On a fresh machine (the synthetic files written first) ROUNDS=1 keeps it under 600 s.
    (while [ ! -e /tmp/synth.done ]; do sleep 2; done
        [ -e /tmp/x32.gguf ] || $R synth --shape qwen2.5-32b --type IQ4_XS -o /tmp/x32.gguf >/tmp/sx32.log 2>&1) &
    XP=$!
    timeout 120 devbin/t_gpu_matvec --test-threads 1 direct_segments 2>&1 | grep -E "^test |result|panicked|failures" | head -8
    REDLINE_MV_DIRECT=1 timeout 100 devbin/t_gpu_speculative --ignored --test-threads 1 2>&1 | grep -E "^test result|panicked|FAILED" | head -4
    echo "== checks $(el)"
    wait $SP
    for r in ${ROUNDS:-1 2}; do
        for v in X=1 REDLINE_MV_DIRECT=1 "REDLINE_MV_DIRECT=1 REDLINE_MV_DIRECT_R=2" "REDLINE_MV_DIRECT=1 REDLINE_MV_DIRECT_R=4"; do
            for m in m32 m27; do ST=$v b $m -n 128 -r 2; done
        done
        echo "round $r $(el)"
    done
    for v in X=1 REDLINE_MV_DIRECT=1; do
        env $v REDLINE_PROFILE_OPS=1 timeout 100 $R bench --device cuda -m /tmp/m32.gguf -p 0 -n 16 -r 1 >"$OUT/prof1_${v%%=*}.txt" 2>&1
        echo "profile $v:"
        grep -E "op profile|^matmul" "$OUT/prof1_${v%%=*}.txt" | head -9 | cut -c1-110
    done
    for v in X=1 REDLINE_MV_DIRECT=1; do
        ST=$v b m27 -n 64 -r 2 --parallel 2
        echo "verify $v: $(env $v timeout 60 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,2 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | tr '\n' ' ')"
    done
    wait $XP
    for r in ${ROUNDS:-1 2}; do
        for v in X=1 REDLINE_MV_DIRECT=1 "REDLINE_MV_DIRECT=1 REDLINE_MV_DIRECT_R=2"; do ST=$v b x32 -n 128 -r 2; done
    done
    echo "== direct $(el)"
    ;;
s21)
    # for session 21's first window (written at the end of session 20): the 8-warp Q4_K default
    # against the old choice on this card (8 streams of both models, one row: issue 6's ratio),
    # x staged at the default 8 warps, then issue 6's serve rows with the new default
    timeout 100 devbin/t_gpu_speculative --ignored --test-threads 1 2>&1 | grep -E "^test result|panicked|FAILED" | head -4
    wait $SP
    for r in ${ROUNDS:-1 2}; do
        for v in X=1 REDLINE_MMV2_Q4_WARPS=0 REDLINE_MMV2_XS=wide; do
            for m in m32 m27; do ST=$v b $m -n 64 -r 2 --parallel 8; done
        done
        b m32 -n 128 -r 2
        echo "round $r $(el)"
    done
    echo "== s21 $(el)"
    [ -z "${SERVE:-}" ] || serve_rows p32 32 1,8,32
    ;;
q4w)
    # session 20: 8 warps per block for the Q4_K mmv2 launches (REDLINE_MMV2_Q4_WARPS=8), with
    # and without the spread padding: the greedy-equality tests with it, then 8 streams,
    # rounds alternating
    REDLINE_MMV2_Q4_WARPS=8 timeout 100 devbin/t_gpu_speculative --ignored --test-threads 1 2>&1 | grep -E "^test result|panicked|FAILED" | head -4
    wait $SP
    for r in ${ROUNDS:-1 2}; do
        for v in X=1 REDLINE_MMV2_Q4_WARPS=8 "REDLINE_MMV2_Q4_WARPS=8 REDLINE_MMV2_SPREAD=1"; do
            ST=$v b m32 -n 64 -r 2 --parallel 8
        done
        echo "round $r $(el)"
    done
    for v in X=1 REDLINE_MMV2_Q4_WARPS=8; do ST=$v b m27 -n 64 -r 2 --parallel 8; done
    b m32 -n 128 -r 2
    echo "== q4w $(el)"
    ;;
spread)
    # session 20: mmv2 launches under two blocks per SM padded with shared memory so their
    # blocks spread over the SMs (REDLINE_MMV2_SPREAD=1), with and without x staged for the
    # wide products (REDLINE_MMV2_XS=wide): 8 streams of both models (rounds alternating), the
    # 8-row profile, the 27B verify cost
    wait $SP
    for r in ${ROUNDS:-1 2}; do
        ms="m32 m27"
        [ "$r" = 1 ] || ms=m32
        for v in X=1 REDLINE_MMV2_SPREAD=1 "REDLINE_MMV2_SPREAD=1 REDLINE_MMV2_XS=wide"; do
            for m in $ms; do ST=$v b $m -n 64 -r 2 --parallel 8; done
        done
        echo "round $r $(el)"
    done
    for v in X=1 REDLINE_MMV2_SPREAD=1,REDLINE_MMV2_XS=wide; do
        env ${v//,/ } REDLINE_PROFILE_OPS=1 timeout 100 $R bench --device cuda -m /tmp/m32.gguf -p 0 -n 16 -r 1 --parallel 8 >"$OUT/prof8_${v%%=*}.txt" 2>&1
        echo "profile $v:"
        grep -E "op profile|^matmul" "$OUT/prof8_${v%%=*}.txt" | head -9 | cut -c1-110
    done
    for v in X=1 REDLINE_MMV2_SPREAD=1; do
        echo "verify $v: $(env $v timeout 60 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,3,4 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | tr '\n' ' ')"
    done
    echo "== spread $(el)"
    ;;
ncudir)
    # session 21: what bounds the direct Q4_K kernel against the staged one, per the same
    # sections as ncuxs (eager one-row 32B steps; gate/up is the 4-row launch of 3456 blocks)
    wait $SP
    NCU=/usr/local/cuda/bin/ncu
    for kp in "mvd_q4_k_n1_r4 REDLINE_MV_DIRECT=1" "mvm_q4_k_r4 X=1"; do
        read -r k v <<<"$kp"
        env $v REDLINE_CUDA_GRAPHS=0 timeout 200 $NCU -k "regex:^$k\$" --launch-skip 8 --launch-count 4 \
            --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
            --section SchedulerStats --section MemoryWorkloadAnalysis -o "$OUT/$k" -f \
            $R bench --device cuda -m /tmp/m32.gguf -p 0 -n 4 -r 1 >"$OUT/ncu_$k.log" 2>&1
        $NCU -i "$OUT/$k.ncu-rep" --page details >"$OUT/det_$k.txt" 2>&1
        rm -f "$OUT/$k.ncu-rep"
        echo "$k ($v):"
        grep -E "^  mv|Duration|Grid Size|Registers Per|Achieved Occupancy|Theoretical Occupancy|DRAM Throughput|Memory Throughput|Issue Slots Busy|Issued Ipc|L1/TEX Hit|L2 Hit|Warp Cycles Per Issued|Eligible Warps|No Eligible" "$OUT/det_$k.txt" | head -40 | cut -c1-150
    done
    echo "== ncudir $(el)"
    ;;
ncuxs)
    # session 20: why the x-staged Q4_K down projection (mmv2s_q4_k_s2x, 43.4 µs alone) took
    # 78.6 µs inside an 8-row step: ncu on eager 8-row 32B steps, the x-staged kernel and the
    # default staged one (gate/up and the down with REDLINE_MMV2_XS=0)
    wait $SP
    NCU=/usr/local/cuda/bin/ncu
    for kp in "mmv2s_q4_k_s2x REDLINE_MMV2_XS=1" "mmv2s_q4_k_s2 REDLINE_MMV2_XS=0"; do
        read -r k v <<<"$kp"
        env $v REDLINE_CUDA_GRAPHS=0 timeout 200 $NCU -k "regex:^$k\$" --launch-skip 8 --launch-count 4 \
            --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
            --section SchedulerStats --section MemoryWorkloadAnalysis -o "$OUT/$k" -f \
            $R bench --device cuda -m /tmp/m32.gguf -p 0 -n 4 -r 1 --parallel 8 >"$OUT/ncu_$k.log" 2>&1
        $NCU -i "$OUT/$k.ncu-rep" --page details >"$OUT/det_$k.txt" 2>&1
        rm -f "$OUT/$k.ncu-rep"
        echo "$k ($v):"
        grep -E "^  mmv2|Duration|Grid Size|Block Size|Registers Per|Dynamic Shared|Achieved Occupancy|Theoretical Occupancy|DRAM Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|Stall|Warp Cycles Per Issued|Eligible Warps|Block Limit" "$OUT/det_$k.txt" | head -80 | cut -c1-150
    done
    echo "== ncuxs $(el)"
    ;;
xs8b)
    # session 20: x staged with the weights in the staged mmv2 kernels from 16384 columns (the
    # default now; REDLINE_MMV2_XS=0 is the old path), the Q6_K staged kernels with it
    # (REDLINE_MMV2_Q6_STAGE=2): checks, the Q4_K / Q6_K sweep at 8 tokens, 8 streams of both
    # models (rounds alternating), one row, the 27B verify cost, the 8-row profile
    timeout 200 devbin/t_gpu_mmq --test-threads 1 mmv2 2>&1 | grep -E "^test |result|panicked|FAIL" | head -12
    MMV2_SWEEP_TYPES=Q4_K,Q6_K MMV2_SWEEP_COUNTS=${COUNTS:-8} timeout 200 devbin/t_gpu_mmq --ignored --nocapture --test-threads 1 mmv2_timing >"$OUT/sweep.txt" 2>&1
    grep -vE "^\s*$" "$OUT/sweep.txt" | grep -E "^ *q[46]_K|^q[46]_K" | cut -c1-300
    echo "== checks, sweep $(el)"
    wait $SP
    for r in ${ROUNDS:-1 2}; do
        ms="m32 m27"
        [ "$r" = 1 ] || ms=m32
        for v in REDLINE_MMV2_XS=0 X=1 REDLINE_MMV2_Q6_STAGE=2 REDLINE_MMV2_WARPS=8; do
            for m in $ms; do ST=$v b $m -n 64 -r 2 --parallel 8; done
        done
        echo "round $r $(el)"
    done
    b m32 -n 128 -r 2
    for v in REDLINE_MMV2_XS=0 X=1; do
        echo "verify $v: $(env $v timeout 60 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,3,4 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | tr '\n' ' ')"
    done
    REDLINE_PROFILE_OPS=1 timeout 100 $R bench --device cuda -m /tmp/m32.gguf -p 0 -n 16 -r 1 --parallel 8 >"$OUT/prof8_xs.txt" 2>&1
    grep -E "op profile|^matmul" "$OUT/prof8_xs.txt" | head -12 | cut -c1-110
    echo "== xs8b $(el)"
    ;;
xs8)
    # session 20: the staged Q4_K mmv2 kernels with x staged too (REDLINE_MMV2_XS=1, 2 or 3
    # stages) at 8 streams, rounds alternating; the 27B verify cost with it
    wait $SP
    for r in ${ROUNDS:-1 2}; do
        for v in X=1 REDLINE_MMV2_XS=1 "REDLINE_MMV2_XS=1 REDLINE_MMV2_STAGE=3"; do
            for m in m32 m27; do ST=$v b $m -n 64 -r 2 --parallel 8; done
        done
        echo "round $r $(el)"
    done
    for v in X=1 REDLINE_MMV2_XS=1; do
        echo "verify $v: $(env $v timeout 60 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,3,4 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | tr '\n' ' ')"
    done
    echo "== xs8 $(el)"
    ;;
prof8)
    # session 20: an 8-row 32B step op by op (REDLINE_PROFILE_OPS: eager steps behind a device
    # spin), Q6_K products on mmv2_q6_k against the cp.async-staged kernels; then the Q6_K
    # kernel sweep at 8 tokens (gpu_mmq's timing test narrowed by MMV2_SWEEP_*)
    timeout 200 devbin/t_gpu_mmq --test-threads 1 mmv2 2>&1 | grep -E "^test |result|panicked|FAIL" | head -12
    wait $SP
    i=0
    for v in ${PV:-X=1 REDLINE_MMV2_SPREAD=1}; do
        i=$((i + 1))
        env ${v//,/ } REDLINE_PROFILE_OPS=1 timeout 100 $R bench --device cuda -m /tmp/m32.gguf -p 0 -n 16 -r 1 --parallel 8 >"$OUT/prof8_$i.txt" 2>&1
        echo "profile $v:"
        grep -E "op profile|^matmul|^attention|^rms_norm|^quantize" "$OUT/prof8_$i.txt" | head -24 | cut -c1-110
    done
    echo "== prof8 $(el)"
    [ -n "${SWEEP:-1}" ] || { echo "== sweep skipped"; continue; }
    MMV2_SWEEP_TYPES=${TYPES:-Q6_K} MMV2_SWEEP_COUNTS=${COUNTS:-8} timeout 240 devbin/t_gpu_mmq --ignored --nocapture --test-threads 1 mmv2_timing >"$OUT/sweep_q6.txt" 2>&1
    grep -vE "^\s*$" "$OUT/sweep_q6.txt" | tail -14 | cut -c1-400
    echo "== sweep $(el)"
    ;;
q6s)
    # session 20: Q6_K few-token products with the weights copied to shared memory by cp.async
    # (REDLINE_MMV2_Q6_STAGE=2|3: mmv2s_q6_k_s*) against the register-staged mmv2_q6_k: checks,
    # then 8 streams of both models (rounds alternating), one row, the 27B verify cost
    timeout 200 devbin/t_gpu_mmq --test-threads 1 mmv2 2>&1 | grep -E "^test |result|panicked|FAIL" | head -12
    echo "== q6s checks $(el)"
    wait $SP
    for r in ${ROUNDS:-1 2}; do
        for v in X=1 REDLINE_MMV2_Q6_STAGE=2 REDLINE_MMV2_Q6_STAGE=3; do
            for m in m32 m27; do ST=$v b $m -n 64 -r 2 --parallel 8; done
        done
        echo "round $r $(el)"
    done
    b m32 -n 128 -r 2
    for v in X=1 REDLINE_MMV2_Q6_STAGE=2; do
        echo "verify $v: $(env $v timeout 60 $R verify-bench -m /tmp/m27.gguf --device cuda -k 1,3,4 -d 256 -r 3 2>&1 | grep -E '^\| (decode|verify)' | tr '\n' ' ')"
    done
    echo "== q6s $(el)"
    ;;
roll)
    # session 20: the one-row attention kernel's score and P V loops rolled (same bits; less
    # code fetched per launch) against the unrolled ones (devbin/k_fa0: flash_attn.cu of
    # 14b99d8), rounds alternating; the attention block left out for the bound; then the suites
    wait $SP
    for r in ${ROUNDS:-1 2}; do
        for v in X=1 "REDLINE_KERNEL_DIR=$PWD/devbin/k_fa0"; do
            for m in m32 m27; do ST=$v b $m -n 128 -r 2; done
        done
        echo "round $r $(el)"
    done
    ST=REDLINE_SKIP_OPS=attention_block b m32 -n 128 -r 2
    echo "== roll $(el)"
    ;;
suites)
    # session 19: the GPU suites at HEAD (the review mend, the conv test's own switch, the
    # prefetch kernels split out of the default ones)
    timeout 200 devbin/t_gpu_matvec --test-threads 1 2>&1 | grep -E "^test |result|panicked|failures" | head -6
    timeout 150 devbin/t_backend_conformance --ignored --test-threads 1 2>&1 | grep -E "^test result|panicked|FAILED|failures:" | head -8
    timeout 300 devbin/t_gpu_decode --test-threads 1 2>&1 | grep -E "^test result|panicked|FAILED|failures:|differ" | head -8
    [ ! -x devbin/t_gpu_attention ] || timeout 150 devbin/t_gpu_attention --include-ignored --test-threads 1 2>&1 | grep -E "^test result|panicked|FAILED" | head -6
    timeout 200 devbin/t_gpu_speculative --ignored --test-threads 1 2>&1 | grep -E "^test result|panicked|FAILED" | head -6
    CHECKED=1
    echo "== suites $(el)"
    ;;
ncu)
    # where the one-token dp4a matvec's warps stall, instruction by instruction (ncu's source
    # page: SASS with the warp-state samples), on eager 27B steps: gate/up and the in-projections
    # (mvm_q4_k_r4) and the Q6_K down (mvm_q6_k_r4)
    wait $SP
    NCU=/usr/local/cuda/bin/ncu
    # ... and the 8-token products of an 8-stream 32B step (mmv2s_q4_k_s2, mmv2_q6_k: issue 6)
    for kp in "mvm_q4_k_r4 m27 1" "mvm_q6_k_r4 m27 1" "mmv2s_q4_k_s2 m32 8" "mmv2_q6_k m32 8"; do
        read -r k m par <<<"$kp"
        REDLINE_CUDA_GRAPHS=0 timeout 200 $NCU -k "regex:^$k\$" --launch-skip 60 --launch-count 2 \
            --section SourceCounters --section WarpStateStats --section SchedulerStats --section LaunchStats \
            --section Occupancy --section SpeedOfLight -o "$OUT/$k" -f \
            $R bench --device cuda -m /tmp/$m.gguf -p 0 -n 4 -r 1 --parallel $par >"$OUT/ncu_$k.log" 2>&1
        $NCU -i "$OUT/$k.ncu-rep" --page source --csv --print-source sass >"$OUT/src_$k.csv" 2>&1
        $NCU -i "$OUT/$k.ncu-rep" --page details >"$OUT/det_$k.txt" 2>&1
        python3 scripts/ncu-top.py "$OUT/src_$k.csv" 25 | cut -c1-220
        ls -la "$OUT" | grep "$k"
    done
    echo "== ncu $(el)"
    ;;
esac
done
