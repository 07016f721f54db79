#!/usr/bin/env python3
"""Dump GGUF metadata and tensor tables with gguf-py, as the oracle for our Rust reader.

Usage:  pip install gguf && python3 scripts/gguf_reference_dump.py
        python3 scripts/gguf_reference_dump.py --check FILE.gguf   # only read FILE, print a summary

Writes one small JSON file per input to tests/data/gguf/ (the fixture models, the vocab-only
GGUFs and stories260K). crates/gguf/tests/reference_dump.rs compares our reader against them.

Per metadata key: {"key", "type", "value"}; "type" is gguf-py's name ("uint32", "string",
"array[string]" ...). Arrays longer than 2*EDGE elements are summarised as
{"len", "first": [...], "last": [...], "fnv1a64": hex} where the hash is FNV-1a 64 over the
array's on-disk payload (each element little-endian; a string as u64 byte length + UTF-8
bytes), so the Rust side can recompute it exactly. Non-finite floats are written as strings.
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGUFReader, GGUFValueType

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT_DIR = os.path.join(ROOT, "tests", "data", "gguf")
EDGE = 4

NUMPY_DTYPE = {
    GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2", GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4",
    GGUFValueType.UINT64: "<u8", GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT32: "<f4", GGUFValueType.FLOAT64: "<f8",
    GGUFValueType.BOOL: "<u1",
}


def fnv1a64(chunks):
    h = 0xCBF29CE484222325
    for chunk in chunks:
        for b in chunk:
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def json_scalar(v):
    if isinstance(v, float) and not np.isfinite(v):
        return str(v)
    return v


def type_name(types):
    if types[0] == GGUFValueType.ARRAY:
        if len(types) < 2:
            return "array[?]"
        return "array[" + type_name(types[1:]) + "]"
    return types[0].name.lower()


def dump_value(field):
    types = field.types
    value = field.contents()
    if types[0] != GGUFValueType.ARRAY:
        if types[0] in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
            value = float(value)
        return json_scalar(value)
    if len(types) > 2 or types[1] == GGUFValueType.ARRAY:
        raise SystemExit(f"{field.name}: nested arrays are not in the reference files")
    elem = types[1]
    if elem in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        value = [float(x) for x in value]
    if elem == GGUFValueType.BOOL:
        value = [bool(x) for x in value]
    if len(value) <= 2 * EDGE:
        return [json_scalar(x) for x in value]
    if elem == GGUFValueType.STRING:
        payload = []
        for s in value:
            b = s.encode("utf-8")
            payload += [struct.pack("<Q", len(b)), b]
        extra = {"total_bytes": sum(len(s.encode("utf-8")) for s in value)}
    else:
        payload = [np.asarray(value, dtype=NUMPY_DTYPE[elem]).tobytes()]
        extra = {}
    return {
        "len": len(value),
        "first": [json_scalar(x) for x in value[:EDGE]],
        "last": [json_scalar(x) for x in value[-EDGE:]],
        "fnv1a64": f"{fnv1a64(payload):016x}",
        **extra,
    }


def dump(path):
    r = GGUFReader(path)
    metadata = []
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue  # gguf-py's pseudo-fields for the header
        metadata.append({"key": key, "type": type_name(field.types), "value": dump_value(field)})
    tensors = [
        {
            "name": t.name,
            "type": t.tensor_type.name.lower(),
            "type_id": int(t.tensor_type),
            "shape": [int(d) for d in t.shape],  # ggml order, ne0 first
            "offset": int(t.data_offset - r.data_offset),
            "n_bytes": int(t.n_bytes),
            "n_elements": int(t.n_elements),
        }
        for t in r.tensors
    ]
    return {
        "version": int(r.fields["GGUF.version"].contents()),
        "alignment": int(r.alignment),
        "data_offset": int(r.data_offset),
        "n_tensors": len(tensors),
        "n_kv": len(metadata),
        "metadata": metadata,
        "tensors": tensors,
    }


def inputs():
    fixtures = os.path.join(ROOT, "tests", "data", "fixtures")
    for arch in sorted(os.listdir(fixtures)):
        for name in sorted(os.listdir(os.path.join(fixtures, arch))):
            if name.startswith("model-") and name.endswith(".gguf"):
                yield f"{arch}-{name[:-5]}", os.path.join(fixtures, arch, name)
    vocab = os.path.join(ROOT, "tests", "data", "vocab")
    for name in sorted(os.listdir(vocab)):
        if name.endswith(".gguf.zst"):
            yield name[: -len(".gguf.zst")], os.path.join(vocab, name)
    yield "stories260K", os.path.join(ROOT, "models", "stories260K.gguf")


def dump_file(path):
    if not path.endswith(".zst"):
        return dump(path)
    with tempfile.NamedTemporaryFile(suffix=".gguf") as tmp:
        subprocess.run(["zstd", "-dcq", path], stdout=tmp, check=True)
        tmp.flush()
        return dump(tmp.name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", metavar="FILE", help="read FILE with gguf-py and print a summary")
    args = ap.parse_args()
    if args.check:
        d = dump(args.check)
        json.dump(d, sys.stdout, indent=1)
        print()
        return
    os.makedirs(OUT_DIR, exist_ok=True)
    total = 0
    for label, path in inputs():
        d = dump_file(path)
        out = os.path.join(OUT_DIR, label + ".json")
        with open(out, "w") as f:
            json.dump(d, f, indent=1, ensure_ascii=False)
            f.write("\n")
        size = os.path.getsize(out)
        total += size
        print(f"{out}: {d['n_kv']} keys, {d['n_tensors']} tensors, {size} bytes")
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
