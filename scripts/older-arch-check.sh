#!/usr/bin/env bash
# Device window: the pre-Ampere code paths (V100 sm_70, Turing sm_75) run on the H200 by
# REDLINE_CUDA_ARCH=75 (crates/cuda/src/device.rs CudaOptions::target_arch): kernels compiled as
# compute_75 PTX, which the driver compiles for the card, so every `__CUDA_ARCH__ < 800` branch
# runs (no cp.async, no int8 mma, no PDL), and every dispatch is decided as on an sm_75 card
# (the dp4a matvec at every token count, no mmq / mmv / mmv2). NVRTC 13 has no compute_70; the
# kernels have no branch between 70 and 75, so 75 takes the V100's paths. Needs the pack built
# with the test binaries and the PTX entries:
#
#   bash scripts/device-tests.sh gpu_decode backend_conformance backend_models gpu_attention gpu_deltanet gpu_mmq
#   PTX_ARCH=75 bash scripts/device-pack.sh
#   run(command="bash scripts/older-arch-check.sh", carry=["devpk"])
#
# The first process to load each module waits for the driver's PTX compile (cached in
# ~/.nv/ComputeCache for the later ones).
set -u -o pipefail
cd "$(dirname "$0")/.."
NO_SYNTH=1 . scripts/device-lib.sh
export REDLINE_CUDA_ARCH=${ARCH_AS:-75}
# selftest loads every program first (the driver's PTX compile, cached for the test binaries) and
# checks every op against the CPU as that architecture
echo "== selftest (as sm_$REDLINE_CUDA_ARCH) $(el)"
timeout 400 $R selftest --bw-gib 0 2>&1 | tail -25
for t in backend_conformance gpu_attention gpu_deltanet gpu_mmq gpu_decode backend_models; do
    [ -x "devbin/t_$t" ] || continue
    echo "== $t (as sm_$REDLINE_CUDA_ARCH) $(el)"
    timeout ${T_LIMIT:-200} "devbin/t_$t" --include-ignored --skip timing --test-threads 1 2>&1 |
        grep -E "^test .*(FAILED|ok)$|test result|panicked|running as|redline: running" | head -40
done
echo "== done $(el)"
