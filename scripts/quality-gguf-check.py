#!/usr/bin/env python3
"""gguf-py's view of GGUF files, as JSON, for crates/convert/tests/gguf_py_check.rs.

For each file: GGUF version, metadata keys in order, general.file_type, and every tensor
(name, ggml type name, dims in ggml order, offset in the data section, byte count) with
statistics of its values dequantized by gguf-py (`gguf.quants.dequantize`): sum and sum of
squares in float64, and the first and last 16 values. The test compares all of it with what redline's reader and dequantizer
see, so a header, tensor table, alignment or block layout that llama.cpp's own Python package
reads differently fails there.

  python3 scripts/quality-gguf-check.py FILE.gguf [FILE.gguf ...]   (needs `pip install gguf`)
Exit status 3 when gguf-py is not installed (the test then skips).
"""

import json
import sys

try:
    import numpy as np
    import gguf
    from gguf.quants import dequantize
except ImportError:
    sys.exit(3)


def describe(path):
    r = gguf.GGUFReader(path)
    keys = [k for k in r.fields if not k.startswith("GGUF.")]
    ft = r.fields.get("general.file_type")
    tensors = []
    for t in r.tensors:
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            v = np.asarray(t.data, dtype=np.float64).reshape(-1)
        else:
            v = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(-1)
        if v.size != int(t.n_elements):
            raise SystemExit(f"{path}: {t.name}: {v.size} values for {t.n_elements} elements")
        tensors.append({
            "name": t.name,
            "type": t.tensor_type.name,
            "dims": [int(d) for d in t.shape],
            "offset": int(t.data_offset) - int(r.data_offset),
            "n_bytes": int(t.n_bytes),
            "sum": float(v.sum()),
            "sum_sq": float((v * v).sum()),
            "head": [float(x) for x in v[:16]],
            "tail": [float(x) for x in v[-16:]],
        })
    return {
        "version": int(r.fields["GGUF.version"].contents()),
        "keys": keys,
        "file_type": int(ft.contents()) if ft is not None else None,
        "tensors": tensors,
    }


def main():
    json.dump({p: describe(p) for p in sys.argv[1:]}, sys.stdout)


if __name__ == "__main__":
    main()
