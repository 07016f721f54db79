#!/usr/bin/env python3
"""llama.cpp's top-1 token per prompt position on the fixtures' q8_0 files, beside the
transformers float64 reference (reference.json).

Answers whether the positions where a q8_0 model's top-1 differs from the reference are a
limit of the format (llama.cpp, on the same file, misses them too) or a redline bug. Builds
scripts/quality-llamacpp-logits.c against a llama.cpp build tree, runs it on
tests/data/fixtures/<arch>/model-q8_0.gguf (and model-f32.gguf as a check of the harness) with
the reference's prompt ids, prints a table per architecture, and writes llama.cpp's q8_0 logits
(f16 KV cache with its default flash attention, as redline's q8_0 test; and f32 KV cache with
flash attention off) to crates/convert/tests/data/llamacpp-q8_0-logits.json,
which crates/convert/tests/llamacpp_q8_0_oracle.rs compares redline against.

  python3 scripts/quality-q8-top1.py --llama-cpp LLAMA_CPP_SOURCE_DIR  (with build/bin built)
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

ARCHS = ["llama", "qwen2", "qwen3", "qwen35"]
FIXTURES = "tests/data/fixtures"
OUT = "crates/convert/tests/data/llamacpp-q8_0-logits.json"


def build_harness(llama, exe):
    subprocess.run(
        ["cc", "-O2", "-Wall", "-o", exe, "scripts/quality-llamacpp-logits.c",
         f"-I{llama}/include", f"-I{llama}/ggml/include", f"-L{llama}/build/bin", "-lllama",
         f"-Wl,-rpath,{llama}/build/bin"],
        check=True)


def llama_logits(exe, model, kv, ids, *extra):
    out = subprocess.run([exe, model, kv, ",".join(map(str, ids)), *extra], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return np.array(json.loads(out)["logits"], dtype=np.float64)


def margin(row):
    s = np.sort(row)[::-1]
    return float(s[0] - s[1])


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp source folder with build/bin")
    ap.add_argument("--work", default="/tmp/redline-quality")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    exe = os.path.join(args.work, "quality-llamacpp-logits")
    build_harness(args.llama_cpp, exe)

    saved = {}
    for arch in ARCHS:
        ref = json.load(open(f"{FIXTURES}/{arch}/reference.json"))
        ids = ref["prompt_ids"]
        want = np.array(ref["logits"], dtype=np.float64)
        f32 = llama_logits(exe, f"{FIXTURES}/{arch}/model-f32.gguf", "f32", ids, "nofa")
        q8 = llama_logits(exe, f"{FIXTURES}/{arch}/model-q8_0.gguf", "f16", ids)
        # f32 cache with flash attention off: plain f32 attention, as redline's KvType::F32
        # (llama.cpp's CPU flash attention works in f16 whatever the cache type).
        q8_f32kv = llama_logits(exe, f"{FIXTURES}/{arch}/model-q8_0.gguf", "f32", ids, "nofa")
        # Rounded to 7 significant digits: far below the q8_0 error, a third of the file.
        saved[arch] = {"prompt_ids": ids,
                       "logits_f16kv": [[float(f"{v:.7g}") for v in row] for row in q8],
                       "logits_f32kv_nofa": [[float(f"{v:.7g}") for v in row] for row in q8_f32kv]}
        f32_err = max(rel_l2(f32[p], want[p]) for p in range(len(ids)))
        agree = sum(int(np.argmax(q8[p]) == np.argmax(want[p])) for p in range(len(ids)))
        agree32 = sum(int(np.argmax(q8_f32kv[p]) == np.argmax(want[p])) for p in range(len(ids)))
        print(f"## {arch}: llama.cpp f32 file (f32 KV, no flash attention) max rel L2 vs reference {f32_err:.2e} "
              f"(top-1 {sum(int(np.argmax(f32[p]) == np.argmax(want[p])) for p in range(len(ids)))}"
              f"/{len(ids)}); q8_0 file top-1 = reference at {agree}/{len(ids)} (f16 KV), "
              f"{agree32}/{len(ids)} (f32 KV, no flash attention)")
        print("| pos | reference top-1 | ref top-2 margin | llama.cpp q8_0 top-1 "
              "| its margin | rel L2 vs ref |")
        print("|---|---|---|---|---|---|")
        for p in range(len(ids)):
            mark = "" if np.argmax(q8[p]) == np.argmax(want[p]) else " **differs**"
            print(f"| {p} | {int(np.argmax(want[p]))} | {margin(want[p]):.4f} "
                  f"| {int(np.argmax(q8[p]))}{mark} | {margin(q8[p]):.4f} "
                  f"| {rel_l2(q8[p], want[p]):.4f} |")
        print()
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"source": "scripts/quality-q8-top1.py: llama.cpp (llama-cpp-python 0.3.36 "
                             "vendored tree), CPU, all-position logits: f16 KV cache (flash attention auto = on), "
                             "f32 KV cache with flash attention off",
                   "archs": saved}, f, separators=(",", ":"))
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
