#!/usr/bin/env bash
# Builds the GPU test binaries named on the command line (default: the decode-path suites) and
# puts them stripped into devbin/ as t_<name>, where scripts/device-pack.sh packs them for a
# device window (run them from the repository root: they find tests/data through the path
# compiled in, so the device's copy of the tree must sit at the same path as here).
#
#   bash scripts/device-tests.sh [TEST...]   e.g. gpu_decode backend_conformance
#   PKG=redline bash scripts/device-tests.sh gpu_speculative   (another package's tests)
set -euo pipefail
cd "$(dirname "$0")/.."
TESTS=("$@")
[ ${#TESTS[@]} -gt 0 ] || TESTS=(backend_conformance gpu_decode gpu_deltanet backend_models)
mkdir -p devbin
args=()
for t in "${TESTS[@]}"; do args+=(--test "$t"); done
cargo test --release -q -p "${PKG:-cuda}" --no-run "${args[@]}" --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in m["target"]["kind"]:
        print(m["target"]["name"], m["executable"])
' | while read -r name exe; do
    strip -o "devbin/t_$name" "$exe"
    echo "devbin/t_$name"
done
