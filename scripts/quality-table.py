#!/usr/bin/env python3
"""Quantization quality per type, redline beside llama.cpp, on the same F32 GGUF and text.

For every type: redline quantizes the F32 model (`redline quantize`), llama.cpp quantizes the
same file (`llama-quantize`), and each engine measures its own file against its own F32 logits
(`redline perplexity --kl-divergence` / `llama-perplexity --kl-divergence`). Two cross runs show
whether a difference comes from the quantizer or from the engine: llama.cpp measures redline's
file (which is also the "llama.cpp loads redline's output" check) and redline measures
llama.cpp's. gguf-py (`pip install gguf`) parses every output, compares the two files tensor by
tensor (type and bytes) and computes the weight error of each against the F32 input.

  relative RMSE = sqrt(sum over all weights of (x - dequant(quant(x)))^2 / sum x^2)
                  (tensors left F32 count with zero error)
  KL            = mean over scored tokens of KL(p_F32 || p_quant), nats
  top-1         = share of scored tokens whose argmax equals the F32 model's
  size / bpw    = tensor bytes of the file, and bits per weight over all its tensors

Both engines chunk the text the same way (llama.cpp's perplexity: chunks of -c tokens, the
second half of each scored). llama.cpp runs with an F32 KV cache (-ctk f32 -ctv f32) because
redline's perplexity keeps its cache in F32; --flash-attn off also makes its attention f32.

Usage (from the repository root, after `cargo build --release -p redline` and building
llama.cpp's llama-quantize and llama-perplexity):

  python3 scripts/quality-table.py --llama-cpp-bin LLAMA_CPP/build/bin \
      [--model tests/data/fixtures/qwen35/model-f32.gguf] \
      [--text /usr/share/common-licenses/GPL-3] [--ctx 256] [--threads 2] \
      [--work /tmp/redline-quality] [--types Q8_0,Q4_K_M,...] [--flash-attn auto|on|off]
      [--no-cross] [--no-llama-perplexity]

Prints markdown tables (for BENCHMARKS.md) and writes WORK/quality.json with every number.
"""

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys

import numpy as np

try:
    import gguf
    from gguf.quants import dequantize
except ImportError:  # pragma: no cover
    sys.exit("needs gguf-py: pip install gguf")

TYPES = [
    "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_1",
    "IQ4_NL", "Q4_0", "IQ4_XS", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K",
]


def run(cmd, log_path):
    """Runs cmd, writes stdout+stderr to log_path, returns the text; raises on failure."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(log_path, "w") as f:
        f.write(" ".join(cmd) + "\n" + p.stdout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}); see {log_path}")
    return p.stdout


def llama_perplexity(args, model, base, compare, log_path):
    """llama-perplexity; returns its summary numbers.

    llama.cpp's logger writes from a thread that the process does not join at exit, so the
    summary lines are sometimes lost (ggml-org/llama.cpp#22142); a lost summary is re-run.
    """
    exe = os.path.join(args.llama_cpp_bin, "llama-perplexity")
    cmd = ["nice", "-n", "10", exe, "-m", model, "-f", args.text, "-c", str(args.ctx),
           "-t", str(args.threads), "-ctk", "f32", "-ctv", "f32", "-fa", args.flash_attn,
           "--kl-divergence-base", base, "--log-file", log_path + ".logfile"]
    if compare:
        cmd.append("--kl-divergence")
    want = "Same top p:" if compare else "Final estimate:"
    for _ in range(8):
        out = run(cmd, log_path)
        if os.path.exists(log_path + ".logfile"):
            with open(log_path + ".logfile") as f:
                out += f.read()
            os.remove(log_path + ".logfile")
        if want in out:
            break
    else:
        raise RuntimeError(f"no summary from llama-perplexity after 8 tries; see {log_path}")
    if not compare:
        m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
        return {"ppl": float(m.group(1)), "ppl_err": float(m.group(2))}
    ppl = re.search(r"Mean PPL\(Q\)\s*:\s*([0-9.]+) ±\s*([0-9.]+)", out)
    kld = re.search(r"Mean    KLD:\s*([0-9.]+) ±\s*([0-9.]+)", out)
    top = re.search(r"Same top p:\s*([0-9.]+) ±\s*([0-9.]+) %", out)
    return {
        "ppl": float(ppl.group(1)), "ppl_err": float(ppl.group(2)),
        "kl": float(kld.group(1)), "kl_err": float(kld.group(2)),
        "top1": float(top.group(1)), "top1_err": float(top.group(2)),
    }


def redline_perplexity(args, model, base, compare, log_path):
    cmd = ["nice", "-n", "10", args.redline, "perplexity", "-m", model, "-f", args.text,
           "-c", str(args.ctx), "-t", str(args.threads), "--kl-divergence-base", base]
    if compare:
        cmd.append("--kl-divergence")
    out = run(cmd, log_path)
    ppl = re.search(r"perplexity: ([0-9.]+) \+/- ([0-9.]+) over (\d+) tokens", out)
    r = {"ppl": float(ppl.group(1)), "ppl_err": float(ppl.group(2)), "n": int(ppl.group(3))}
    if compare:
        kl = re.search(r"KL divergence: mean ([0-9.]+) nats over (\d+) tokens; "
                       r"top-1 agreement ([0-9.]+) %", out)
        r.update({"kl": float(kl.group(1)), "top1": float(kl.group(3))})
    return r


NO_PPL = {"ppl": float("nan"), "kl": float("nan"), "top1": float("nan")}


def tensor_values(t):
    """A tensor of a GGUFReader as float64, in its stored (row-major, ggml order) layout."""
    if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        v = np.asarray(t.data, dtype=np.float64)
    else:
        v = dequantize(t.data, t.tensor_type).astype(np.float64)
    return v.reshape(-1)


def weights_report(f32_path, path):
    """Size, bpw, relative RMSE of a quantized file against the F32 one, and its type counts."""
    ref = {t.name: t for t in gguf.GGUFReader(f32_path).tensors}
    q = gguf.GGUFReader(path)
    err2 = 0.0
    norm2 = 0.0
    n_bytes = 0
    n_el = 0
    types = {}
    for t in q.tensors:
        r = ref[t.name]
        if list(t.shape) != list(r.shape):
            raise RuntimeError(f"{path}: {t.name} shape {list(t.shape)} != {list(r.shape)}")
        x = tensor_values(r)
        y = tensor_values(t)
        err2 += float(np.sum((x - y) ** 2))
        norm2 += float(np.sum(x ** 2))
        n_bytes += int(t.n_bytes)
        n_el += int(t.n_elements)
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    return {
        "file_bytes": os.path.getsize(path),
        "tensor_bytes": n_bytes,
        "bpw": 8.0 * n_bytes / n_el,
        "rel_rmse": (err2 / norm2) ** 0.5,
        "types": types,
    }


def compare_files(a_path, b_path):
    """Tensors of equal name: how many have the same type and bytes; the ones that differ."""
    a = {t.name: t for t in gguf.GGUFReader(a_path).tensors}
    b = {t.name: t for t in gguf.GGUFReader(b_path).tensors}
    if set(a) != set(b):
        raise RuntimeError(f"tensor names differ: {sorted(set(a) ^ set(b))}")
    same = 0
    diff = []
    for name, ta in a.items():
        tb = b[name]
        if ta.tensor_type == tb.tensor_type and ta.data.tobytes() == tb.data.tobytes():
            same += 1
        else:
            diff.append(f"{name}: {ta.tensor_type.name} vs {tb.tensor_type.name}")
    return {"n": len(a), "identical": same, "differ": diff}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp-bin", required=True,
                    help="folder with llama-quantize and llama-perplexity")
    ap.add_argument("--redline", default="target/release/redline")
    ap.add_argument("--model", default="tests/data/fixtures/qwen35/model-f32.gguf")
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default="/tmp/redline-quality")
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--flash-attn", default="auto", choices=["auto", "on", "off"],
                    help="llama-perplexity -fa (its CPU flash attention computes in f16 even "
                         "with an f32 cache; off makes its attention plain f32 like redline's)")
    ap.add_argument("--no-cross", action="store_true",
                    help="skip the cross runs (each engine on the other's file); use when the "
                         "files are identical anyway (the 'identical tensors' column says)")
    ap.add_argument("--no-llama-perplexity", action="store_true",
                    help="quantize with both tools but measure with redline only (llama.cpp's "
                         "numbers from an earlier run on byte-identical files still apply)")
    args = ap.parse_args()
    types = [t for t in args.types.split(",") if t]
    os.makedirs(args.work, exist_ok=True)
    W = lambda name: os.path.join(args.work, name)  # noqa: E731

    with open(args.text, "rb") as f:
        text_sha = hashlib.sha256(f.read()).hexdigest()
    print(f"model {args.model}, text {args.text} (sha256 {text_sha}), -c {args.ctx}",
          file=sys.stderr)

    rl_base = W("rl-base.kld")
    lcp_base = W("lcp-base.kld")
    results = {
        "model": args.model, "text": args.text, "text_sha256": text_sha, "ctx": args.ctx,
        "flash_attn": args.flash_attn,
        "base": {
            "redline": redline_perplexity(args, args.model, rl_base, False, W("rl-base.log")),
            "llama.cpp": ({"ppl": float("nan")} if args.no_llama_perplexity else
                          llama_perplexity(args, args.model, lcp_base, False, W("lcp-base.log"))),
        },
        "f32": weights_report(args.model, args.model),
        "types": {},
    }
    quantize = os.path.join(args.llama_cpp_bin, "llama-quantize")
    for ty in types:
        print(f"{ty} ...", file=sys.stderr)
        rl_file, lcp_file = W(f"rl-{ty}.gguf"), W(f"lcp-{ty}.gguf")
        run(["nice", "-n", "10", args.redline, "quantize", args.model, rl_file, ty,
             "-t", str(args.threads)], W(f"rl-quantize-{ty}.log"))
        run(["nice", "-n", "10", quantize, args.model, lcp_file, ty, str(args.threads)],
            W(f"lcp-quantize-{ty}.log"))
        results["types"][ty] = {
            "redline": {
                **weights_report(args.model, rl_file),
                **redline_perplexity(args, rl_file, rl_base, True, W(f"rl-rl-{ty}.log")),
            },
            "llama.cpp": {
                **weights_report(args.model, lcp_file),
                **(NO_PPL if args.no_llama_perplexity else
                   llama_perplexity(args, lcp_file, lcp_base, True, W(f"lcp-lcp-{ty}.log"))),
            },
            "files": compare_files(rl_file, lcp_file),
        }
        if not (args.no_cross or args.no_llama_perplexity):
            # llama.cpp loading and measuring redline's file, and the reverse.
            results["types"][ty]["llama.cpp on redline file"] = llama_perplexity(
                args, rl_file, lcp_base, True, W(f"lcp-rl-{ty}.log"))
            results["types"][ty]["redline on llama.cpp file"] = redline_perplexity(
                args, lcp_file, rl_base, True, W(f"rl-lcp-{ty}.log"))
    with open(W("quality.json"), "w") as f:
        json.dump(results, f, indent=1)

    b = results["base"]
    print(f"F32 base perplexity: redline {b['redline']['ppl']:.4f}, "
          f"llama.cpp {b['llama.cpp']['ppl']:.4f} over {b['redline']['n']} scored tokens\n")
    print("| type | MiB rl / lcp | bpw rl / lcp | rel RMSE rl / lcp | KL rl / lcp | "
          "top-1 % rl / lcp | PPL rl / lcp | identical tensors |")
    print("|---|---|---|---|---|---|---|---|")
    for ty, r in results["types"].items():
        a, c = r["redline"], r["llama.cpp"]
        print(f"| {ty} | {a['tensor_bytes'] / 2**20:.3f} / {c['tensor_bytes'] / 2**20:.3f} "
              f"| {a['bpw']:.2f} / {c['bpw']:.2f} | {a['rel_rmse']:.5f} / {c['rel_rmse']:.5f} "
              f"| {a['kl']:.5f} / {c['kl']:.5f} | {a['top1']:.2f} / {c['top1']:.2f} "
              f"| {a['ppl']:.2f} / {c['ppl']:.2f} "
              f"| {r['files']['identical']}/{r['files']['n']} |")
    if args.no_cross or args.no_llama_perplexity:
        return
    print("\nCross: each engine on the other's file (KL against its own F32 base).\n")
    print("| type | llama.cpp on redline file: KL, top-1 %, PPL | redline on llama.cpp file: "
          "KL, top-1 %, PPL | tensors that differ (redline vs llama.cpp) |")
    print("|---|---|---|---|")
    for ty, r in results["types"].items():
        x, y = r["llama.cpp on redline file"], r["redline on llama.cpp file"]
        print(f"| {ty} | {x['kl']:.5f}, {x['top1']:.2f}, {x['ppl']:.2f} "
              f"| {y['kl']:.5f}, {y['top1']:.2f}, {y['ppl']:.2f} "
              f"| {'; '.join(r['files']['differ']) or '–'} |")


if __name__ == "__main__":
    main()
