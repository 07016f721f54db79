#!/usr/bin/env python3
"""Records what llama-quantize makes of the fixture models: per output type, every tensor's
ggml type and a 64-bit FNV-1a hash of its bytes (tests/data/quant/llama_quantize_<arch>.json).

`cargo test -p convert --test quantize_vs_llama_quantize` quantizes the same F32 files with
redline and compares type and hash tensor by tensor, so the whole mix (which tensor gets which
type, Qwen3.5's `attn_qkv` and `ssm_alpha` / `ssm_beta` included) and the quantizer's bytes are
pinned to llama.cpp without shipping its files (a few MB each).

  python3 scripts/gen_llama_quantize_manifest.py --llama-cpp-bin LLAMA/build/bin \
      [--commit 0c1e570] [--arch qwen35,llama,qwen2,qwen3,stories260K] [--work DIR]

Needs gguf-py (`pip install gguf`). llama-quantize runs with 2 threads (the bytes do not
depend on the thread count).
"""

import argparse
import json
import os
import subprocess

import gguf

TYPES = [
    "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_1",
    "IQ4_NL", "Q4_0", "IQ4_XS", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K",
]


def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp-bin", required=True)
    ap.add_argument("--commit", default="0c1e570")
    ap.add_argument("--arch", default="qwen35,llama,qwen2,qwen3,stories260K")
    ap.add_argument("--work", default="/tmp/lq-manifest")
    ap.add_argument("--imatrix", default="tests/data/quant/qwen35-imatrix.gguf",
                    help="qwen35 only: also every type with this importance matrix (made by "
                         "`redline imatrix -m F32 -f /usr/share/common-licenses/GPL-3 -c 256 "
                         "--chunks 8`)")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    env = dict(os.environ, LD_LIBRARY_PATH=a.llama_cpp_bin)
    for arch in a.arch.split(","):
        # stories260K: trained, rows of 64 and 172 (llama.cpp's type fallbacks, F16 ffn_down).
        rel = ("models/stories260K.gguf" if arch == "stories260K"
               else f"tests/data/fixtures/{arch}/model-f32.gguf")
        src = os.path.join(root, rel)
        out = {"llama_cpp": a.commit, "source": rel,
               "hash": "fnv1a64 of the tensor's bytes", "types": {}}
        for ty in TYPES:
            dst = os.path.join(a.work, f"{arch}-{ty}.gguf")
            subprocess.run([os.path.join(a.llama_cpp_bin, "llama-quantize"), src, dst, ty, "2"],
                           check=True, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            r = gguf.GGUFReader(dst)
            out["types"][ty] = {t.name: [t.tensor_type.name, fnv1a64(t.data.tobytes())]
                                for t in r.tensors}
            os.remove(dst)
        # From a 16-bit file and requantized from Q8_0 (--allow-requantize): FIRST>SECOND.
        if arch == "qwen35":
            out["chains"] = {}
            for first, second in (("F16", "Q4_K_M"), ("BF16", "Q4_K_M"), ("Q8_0", "Q4_K_M")):
                mid = os.path.join(a.work, f"{arch}-{first}.gguf")
                dst = os.path.join(a.work, f"{arch}-{first}-{second}.gguf")
                q = os.path.join(a.llama_cpp_bin, "llama-quantize")
                for cmd in ([q, src, mid, first, "2"],
                            [q, "--allow-requantize", mid, dst, second, "2"]):
                    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
                r = gguf.GGUFReader(dst)
                out["chains"][f"{first}>{second}"] = {
                    t.name: [t.tensor_type.name, fnv1a64(t.data.tobytes())] for t in r.tensors}
                os.remove(mid)
                os.remove(dst)
        if arch == "qwen35" and a.imatrix:
            out["imatrix"] = a.imatrix
            out["imatrix_types"] = {}
            for ty in TYPES:
                dst = os.path.join(a.work, f"{arch}-imat-{ty}.gguf")
                subprocess.run([os.path.join(a.llama_cpp_bin, "llama-quantize"), "--imatrix",
                                os.path.join(root, a.imatrix), src, dst, ty, "2"],
                               check=True, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
                r = gguf.GGUFReader(dst)
                out["imatrix_types"][ty] = {
                    t.name: [t.tensor_type.name, fnv1a64(t.data.tobytes())] for t in r.tensors}
                os.remove(dst)
        path = os.path.join(root, "tests/data/quant", f"llama_quantize_{arch}.json")
        with open(path, "w") as f:
            json.dump(out, f, indent=0, sort_keys=False)
            f.write("\n")
        print(path)


if __name__ == "__main__":
    main()
