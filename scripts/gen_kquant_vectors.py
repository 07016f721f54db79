#!/usr/bin/env python3
"""Generate llama.cpp reference vectors for the K-quant / IQ4 / imatrix quantizers
(crates/quant/tests/llama_cpp_quantize.rs).

Oracle: ggml's own quantizers (ggml/src/ggml-quants.c), compiled with scripts/kquant_oracle.c
by gcc -O2 -ffp-contract=off -DNDEBUG (no fused multiply-add, like our Rust; a build with
-march=native may fuse and differ in rare last-bit ties). Generated with the llama.cpp
vendored in the PyPI sdist llama_cpp_python==0.3.36 (ggml-quants.c sha256
7878680cc60493f98469a116e9b14af8b84789292ccf891c249230b2fa3d157f), numpy==2.4.6, gcc:

    pip download llama_cpp_python==0.3.36 --no-deps --no-binary :all:   # or any llama.cpp checkout
    python3 scripts/gen_kquant_vectors.py path/to/llama.cpp/ggml

Files tests/data/quant/kquant_<type>[_imatrix].bin (little-endian):
    b"RLQK", u32 version=1, u32 ggml type id, u32 n_rows, u32 n_per_row, u32 has_imatrix,
    f32 src[n_rows * n_per_row], f32 imatrix[n_per_row] if has_imatrix,
    the bytes of ggml's quantize_<type>(src, n_rows, n_per_row, imatrix).
"""

import hashlib
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "quant"

# ggml type ids
TYPES = {"q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q2_k": 10, "q3_k": 11, "q4_k": 12,
         "q5_k": 13, "q6_k": 14, "iq4_nl": 20, "iq4_xs": 23}
# without an imatrix the 32-element formats are the gguf-py-checked reference quantizers
NO_IMATRIX = ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs"]
WITH_IMATRIX = list(TYPES)

N_ROWS, N_PER_ROW = 8, 512


def build_oracle(ggml: Path, tmp: Path) -> Path:
    exe = tmp / "kquant_oracle"
    subprocess.run(["gcc", "-O2", "-ffp-contract=off", "-DNDEBUG", f"-I{ggml}/include", f"-I{ggml}/src",
                    f"-I{ggml}/src/ggml-cpu", str(ROOT / "scripts" / "kquant_oracle.c"),
                    str(ggml / "src" / "ggml-quants.c"), "-lm", "-o", str(exe)], check=True,
                   stderr=subprocess.DEVNULL)
    return exe


def rows(rng: np.random.Generator) -> np.ndarray:
    """N_ROWS rows: Gaussian weights at different scales, heavy tails / outliers, and blocks
    that are all zero, constant, tiny, or one-signed."""
    x = rng.normal(size=(N_ROWS, N_PER_ROW)).astype(np.float32)
    x[0] *= 0.02                                   # typical weight magnitude
    x[1] = rng.standard_t(3, size=N_PER_ROW) * 0.05  # heavy tails
    x[2, rng.integers(0, N_PER_ROW, size=6)] *= 30  # outliers
    x[3, :32] = 0.0                                # zero block (32-wide formats)
    x[3, 32:64] = 0.125                            # constant block
    x[3, 64:96] = np.abs(x[3, 64:96])              # all positive
    x[3, 96:128] = -np.abs(x[3, 96:128])           # all negative
    x[3, 256:512] *= 1e-6                          # tiny super-block
    x[2, 256:512] = 0.0                            # zero super-block
    x[4:] *= np.float32(10.0) ** rng.uniform(-3, 1, size=(N_ROWS - 4, 1)).astype(np.float32)
    return x.astype(np.float32)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    ggml = Path(sys.argv[1]).resolve()
    sha = hashlib.sha256((ggml / "src" / "ggml-quants.c").read_bytes()).hexdigest()
    print(f"ggml-quants.c sha256 {sha}", file=sys.stderr)
    rng = np.random.default_rng(0xC0FFEE)
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_oracle(ggml, Path(tmp))
        jobs = [(name, False) for name in NO_IMATRIX] + [(name, True) for name in WITH_IMATRIX]
        for name, with_imatrix in jobs:
            x = rows(rng)
            imatrix = None
            if with_imatrix:
                imatrix = np.exp(rng.normal(size=N_PER_ROW)).astype(np.float32)
                imatrix[rng.integers(0, N_PER_ROW, size=8)] = 0.0   # unused columns
            hdr = struct.pack("<IIII", TYPES[name], N_ROWS, N_PER_ROW, int(with_imatrix))
            payload = hdr + x.astype("<f4").tobytes() + (imatrix.astype("<f4").tobytes() if with_imatrix else b"")
            q = subprocess.run([str(exe)], input=payload, stdout=subprocess.PIPE, check=True).stdout
            suffix = "_imatrix" if with_imatrix else ""
            path = OUT / f"kquant_{name}{suffix}.bin"
            with open(path, "wb") as f:
                f.write(b"RLQK" + struct.pack("<I", 1) + hdr)
                f.write(payload[len(hdr):])
                f.write(q)
            print(f"{path.name}: {len(q)} bytes quantized", file=sys.stderr)


if __name__ == "__main__":
    main()
