#!/usr/bin/env bash
# Packs what a device window needs into devpk/pack.tar.xz (ignored by git), small enough to
# travel beside the tracked tree (~47 MB of 64 MiB): a stripped release `redline` (~15 MB, ~5 MB
# compressed), the CUDA kernel cache prefilled for sm_90 with NVRTC 13.0 (the H200 image's
# version: nothing compiles on the card), and any extra files named on the command line.
#
#   bash scripts/device-pack.sh [FILE...]
#   ONLY=mmv.cu bash scripts/device-pack.sh   (recompile one program into the existing cache)
#   PTX_ARCH=75 bash scripts/device-pack.sh    (also compute_75 PTX: REDLINE_CUDA_ARCH=75 runs)
#   CLEAN=1 bash scripts/device-pack.sh        (drop the cache's old entries first)
#   PDL_MASKS="7 127" bash scripts/device-pack.sh  (also REDLINE_PDL_EARLY=7 and =127's kernels)
#   TRACE=1 bash scripts/device-pack.sh        (also every program with the REDLINE_TRACE probe; with
#                                               PDL_MASKS also those masks' programs with it)
#   then: run(command="tar xJf devpk/pack.tar.xz && XDG_CACHE_HOME=$PWD/devbin/cache devbin/redline …",
#             carry=["devpk"])
#
# Why: an unstripped release binary (~110 MB) alone is over the device tool's 64 MiB, and a cold
# kernel compile costs ~90 s of device time per window.
set -euo pipefail
cd "$(dirname "$0")/.."
NVRTC_DIR=${NVRTC_DIR:-/tmp/nvrtc13}
ARCH=${ARCH:-90}
cargo build --release -q -p redline
[ -z "${CLEAN:-}" ] || rm -rf devbin/cache
mkdir -p devbin/cache devpk
strip -o devbin/redline target/release/redline
if [ ! -e "$NVRTC_DIR/x/nvidia/cu13/lib/libnvrtc.so.13" ]; then
    mkdir -p "$NVRTC_DIR"
    python3 -m pip download -q --no-deps --only-binary=:all: "nvidia-cuda-nvrtc>=13.0,<13.1" -d "$NVRTC_DIR"
    python3 -m zipfile -e "$NVRTC_DIR"/nvidia_cuda_nvrtc-13.0.*.whl "$NVRTC_DIR/x"
fi
LIB="$NVRTC_DIR/x/nvidia/cu13/lib"
# libnvrtc loads libnvrtc-builtins from the library path
LD_LIBRARY_PATH="$LIB" cargo run --release -q -p cuda --bin kernel-compile-check -- \
    --nvrtc "$LIB/libnvrtc.so.13" --arch "$ARCH" --write-cache devbin/cache ${ONLY:+--only "$ONLY"}
# devbin/k_*/: older kernel files for A/B runs with REDLINE_KERNEL_DIR (e.g. devbin/k_s15 holds
# f6cc4dc's mmv.cu and mmq.cu); their cubins go into the same cache under the keys a run with
# that variable looks up
for d in devbin/k_*/; do
    [ -d "$d" ] || continue
    for f in "$d"*.cu; do
        REDLINE_KERNEL_DIR="$PWD/$d" LD_LIBRARY_PATH="$LIB" cargo run --release -q -p cuda --bin kernel-compile-check -- \
            --nvrtc "$LIB/libnvrtc.so.13" --arch "$ARCH" --write-cache devbin/cache --only "$(basename "$f")"
    done
done
# PDL_MASKS="7 127": the programs REDLINE_PDL_EARLY changes, compiled for each of those masks
# too (the define goes in front of their source, so each mask has its own cache keys)
for m in ${PDL_MASKS:-}; do
    for f in model_ops.cu deltanet.cu flash_attn.cu; do
        REDLINE_PDL_EARLY=$m LD_LIBRARY_PATH="$LIB" cargo run --release -q -p cuda --bin kernel-compile-check -- \
            --nvrtc "$LIB/libnvrtc.so.13" --arch "$ARCH" --write-cache devbin/cache --only "$f"
    done
done
# TRACE=1: every program once more with the block-timeline probe (REDLINE_TRACE puts its
# #define in front of each source: their own cache keys; the path given here is not used)
if [ -n "${TRACE:-}" ]; then
    REDLINE_TRACE=/dev/null LD_LIBRARY_PATH="$LIB" cargo run --release -q -p cuda --bin kernel-compile-check -- \
        --nvrtc "$LIB/libnvrtc.so.13" --arch "$ARCH" --write-cache devbin/cache ${ONLY:+--only "$ONLY"}
    # with PDL_MASKS too: the mask programs with the probe (both defines: their own keys)
    for m in ${PDL_MASKS:-}; do
        for f in model_ops.cu deltanet.cu flash_attn.cu; do
            REDLINE_TRACE=/dev/null REDLINE_PDL_EARLY=$m LD_LIBRARY_PATH="$LIB" cargo run --release -q -p cuda \
                --bin kernel-compile-check -- --nvrtc "$LIB/libnvrtc.so.13" --arch "$ARCH" --write-cache devbin/cache \
                --only "$f"
        done
    done
fi
if [ -n "${PTX_ARCH:-}" ]; then
    LD_LIBRARY_PATH="$LIB" cargo run --release -q -p cuda --bin kernel-compile-check -- \
        --nvrtc "$LIB/libnvrtc.so.13" --arch "$PTX_ARCH" --ptx --write-cache devbin/cache ${ONLY:+--only "$ONLY"}
fi
for f in "$@"; do cp -r "$f" devbin/; done
tar cJf devpk/pack.tar.xz devbin
ls -la devpk/pack.tar.xz
