#!/usr/bin/env bash
# Registers, spills and SASS instruction counts of compiled kernels, without a GPU: the kernel
# cache's cubins (written by kernel-compile-check --write-cache, or by a run on a card) read with
# cuobjdump from NVIDIA's PyPI wheel. What a kernel edit does to occupancy (registers per thread:
# <= 128 lets 4 blocks of 128 threads share an SM, <= 96 five, <= 80 six) and to the issue work
# per weight byte shows here before any device time is spent (BENCHMARKS.md, session 11).
#
#   bash scripts/sass-stats.sh CUBIN [KERNEL-REGEX]       e.g. 'mvm_q[46]_k_r[24]$'
#   bash scripts/sass-stats.sh --cache PROGRAM [REGEX]    newest cubin of PROGRAM (matvec_quant,
#                                                          mmv, ...) under devbin/cache
#
# Prints one line per kernel: name, registers, local (spill) bytes, stack bytes (where spills
# also go), shared bytes, SASS instructions, and the counts of the most common opcodes.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=${SASS_TOOLS:-/tmp/sass-tools}
if [ ! -x "$TOOLS/x/nvidia/cu13/bin/cuobjdump" ] || [ ! -x "$TOOLS/x/nvidia/cu13/bin/nvdisasm" ]; then
    mkdir -p "$TOOLS"
    # cuobjdump -sass runs nvdisasm
    python3 -m pip download -q --no-deps --only-binary=:all: nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm -d "$TOOLS"
    for w in "$TOOLS"/nvidia_cuda_cuobjdump-*.whl "$TOOLS"/nvidia_cuda_nvdisasm-*.whl; do
        python3 -m zipfile -e "$w" "$TOOLS/x"
    done
    chmod +x "$TOOLS"/x/nvidia/cu13/bin/*
fi
OBJDUMP="$TOOLS/x/nvidia/cu13/bin/cuobjdump"
export PATH="$TOOLS/x/nvidia/cu13/bin:$PATH"
if [ "${1:-}" = "--cache" ]; then
    CUBIN=$(ls -t devbin/cache/redline/kernels/"$2"-*.cubin | head -1)
    shift 2
else
    CUBIN=$1
    shift
fi
REGEX=${1:-.}
echo "$CUBIN"
"$OBJDUMP" -res-usage "$CUBIN" | awk '/Function/ {sub(":", "", $2); name = $2} /REG:/ {print name, $0}' |
    while read -r name rest; do
    grep -qE "$REGEX" <<< "$name" || continue
    regs=$(grep -oE 'REG:[0-9]+' <<< "$rest" | cut -d: -f2)
    local_b=$(grep -oE 'LOCAL:[0-9]+' <<< "$rest" | cut -d: -f2)
    # spills can also live on the stack (STACK:, with LDL / STL), which LOCAL: does not count
    stack=$(grep -oE 'STACK:[0-9]+' <<< "$rest" | cut -d: -f2)
    shared=$(grep -oE 'SHARED:[0-9]+' <<< "$rest" | cut -d: -f2)
    sass=$("$OBJDUMP" -sass -fun "$name" "$CUBIN" | grep -E '^\s+/\*[0-9a-f]+\*/' |
        sed -E 's/^\s+\/\*[0-9a-f]+\*\/\s+//; s/^@!?U?P[0-9T]+\s+//' | awk '{print $1}' | sed 's/\..*//;s/;//')
    total=$(wc -l <<< "$sass")
    top=$(sort <<< "$sass" | uniq -c | sort -rn | head -8 | awk '{printf "%s:%s ", $2, $1}')
    printf '%-28s regs %3s  local %4s  stack %3s  shared %6s  sass %5s  %s\n' "$name" "$regs" "$local_b" "${stack:-0}" "$shared" "$total" "$top"
done
