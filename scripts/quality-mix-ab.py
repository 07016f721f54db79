#!/usr/bin/env python3
"""A/B of quant mixes: one F32 GGUF quantized with several per-tensor mixes, each file measured
by both engines (KL divergence, top-1 agreement, perplexity against the F32 model).

Used to decide mix rules with a measurement (issue #7): e.g. whether Qwen3.5's DeltaNet
`attn_qkv` should count with `attn_v` for the bumps (llama.cpp 0c1e570) or keep the base type,
and whether `ssm_alpha` / `ssm_beta` should be quantized. The mixes per type:

  redline           `redline quantize F32 OUT TYPE`
  lcp               `llama-quantize F32 OUT TYPE`
  lcp+NAME          `llama-quantize --tensor-type PATTERN=TYPE ... F32 OUT TYPE` for every
                    `--variant NAME:PATTERN=TYPE[,PATTERN=TYPE...]` given (several allowed;
                    `{base}` in a TYPE is the type's base ggml type, e.g. q4_K for Q4_K_M; a
                    variant given as TYPE/NAME:... applies to that type only);
                    llama.cpp's quantizer is byte-identical to redline's, so such a file is
                    exactly the mix it names

Every file is measured by `redline perplexity --kl-divergence` against redline's F32 base and by
`llama-perplexity --kl-divergence` against llama.cpp's (helpers shared with quality-table.py),
and gguf-py reports its size, bits per weight, relative RMSE and the tensors whose type differs
from the `redline` file. Prints one markdown table; WORK/mix-ab.json keeps every number.

  python3 scripts/quality-mix-ab.py --llama-cpp-bin LLAMA/build/bin --types Q4_K_M,Q3_K_M \
      --variant ssmf32:ssm_alpha=f32,ssm_beta=f32 [--model F32.gguf] [--text FILE] [--ctx 256]
      [--chunks N] [--work DIR] [--no-llama-perplexity]
"""

import argparse
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("quality_table",
                                               os.path.join(HERE, "quality-table.py"))
qt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(qt)


# llama_ftype_get_default_type: the ggml type most tensors of a file type get.
BASE = {"Q8_0": "q8_0", "Q6_K": "q6_K", "Q5_K_M": "q5_K", "Q5_K_S": "q5_K", "Q5_1": "q5_1",
        "Q5_0": "q5_0", "Q4_K_M": "q4_K", "Q4_K_S": "q4_K", "Q4_1": "q4_1", "IQ4_NL": "iq4_nl",
        "Q4_0": "q4_0", "IQ4_XS": "iq4_xs", "Q3_K_L": "q3_K", "Q3_K_M": "q3_K", "Q3_K_S": "q3_K",
        "Q2_K": "q2_K"}


def with_chunks(cmd_fn, chunks):
    """Wraps a perplexity helper of quality-table.py so that it scores at most `chunks`."""
    if not chunks:
        return cmd_fn

    def wrapped(args, model, base, compare, log_path):
        orig = qt.run

        def run_limited(cmd, log):
            return orig(cmd + ["--chunks", str(chunks)], log)

        qt.run = run_limited
        try:
            return cmd_fn(args, model, base, compare, log_path)
        finally:
            qt.run = orig
    return wrapped


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp-bin", required=True)
    ap.add_argument("--redline", default="target/release/redline")
    ap.add_argument("--model", default="tests/data/fixtures/qwen35/model-f32.gguf")
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=0, help="score at most this many chunks")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default="/tmp/redline-mix-ab")
    ap.add_argument("--types", required=True)
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME:PATTERN=TYPE[,PATTERN=TYPE...] (llama-quantize --tensor-type)")
    ap.add_argument("--flash-attn", default="off", choices=["auto", "on", "off"])
    ap.add_argument("--no-llama-perplexity", action="store_true",
                    help="measure with redline only")
    ap.add_argument("--no-redline-quantize", action="store_true",
                    help="leave out the `redline` mix (then the first mix is the reference "
                         "for the last column)")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    W = lambda name: os.path.join(args.work, name)  # noqa: E731
    rl_ppl = with_chunks(qt.redline_perplexity, args.chunks)
    lcp_ppl = with_chunks(qt.llama_perplexity, args.chunks)
    quantize = os.path.join(args.llama_cpp_bin, "llama-quantize")

    variants = []  # (only for this type or None, name, "PATTERN=TYPE,...")
    for v in args.variant:
        name, _, spec = v.partition(":")
        only, _, name = name.rpartition("/")
        variants.append((only or None, name, spec))

    rl_base, lcp_base = W("rl-base.kld"), W("lcp-base.kld")
    res = {"model": args.model, "text": args.text, "ctx": args.ctx, "chunks": args.chunks,
           "base": {"redline": rl_ppl(args, args.model, rl_base, False, W("rl-base.log"))},
           "types": {}}
    if not args.no_llama_perplexity:
        res["base"]["llama.cpp"] = lcp_ppl(args, args.model, lcp_base, False, W("lcp-base.log"))
    print(f"F32 base: {res['base']}", file=sys.stderr)

    for ty in [t for t in args.types.split(",") if t]:
        files = {}
        if not args.no_redline_quantize:
            files["redline"] = W(f"redline-{ty}.gguf")
            qt.run(["nice", "-n", "10", args.redline, "quantize", args.model, files["redline"],
                    ty, "-t", str(args.threads)], W(f"q-redline-{ty}.log"))
        files["lcp"] = W(f"lcp-{ty}.gguf")
        qt.run(["nice", "-n", "10", quantize, args.model, files["lcp"], ty, str(args.threads)],
               W(f"q-lcp-{ty}.log"))
        for only, name, spec in variants:
            if only and only != ty:
                continue
            extra = []
            for pair in spec.replace("{base}", BASE[ty]).split(","):
                extra += ["--tensor-type", pair]
            files[f"lcp+{name}"] = W(f"lcp+{name}-{ty}.gguf")
            qt.run(["nice", "-n", "10", quantize, *extra, args.model, files[f"lcp+{name}"], ty,
                    str(args.threads)], W(f"q-lcp+{name}-{ty}.log"))
        rows = {}
        ref = next(iter(files.values()))
        for mix, path in files.items():
            print(f"{ty} {mix} ...", file=sys.stderr)
            r = {**qt.weights_report(args.model, path),
                 "differ_from_first": qt.compare_files(ref, path)["differ"],
                 "redline": rl_ppl(args, path, rl_base, True, W(f"rl-{mix}-{ty}.log"))}
            if not args.no_llama_perplexity:
                r["llama.cpp"] = lcp_ppl(args, path, lcp_base, True, W(f"lcp-{mix}-{ty}.log"))
            rows[mix] = r
        res["types"][ty] = rows
        with open(W("mix-ab.json"), "w") as f:
            json.dump(res, f, indent=1)

    print("| type | mix | MiB | bpw | rel RMSE | KL redline | top-1 % redline | PPL redline "
          "| KL llama.cpp | top-1 % llama.cpp | tensors whose type differs from the first mix's |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for ty, rows in res["types"].items():
        for mix, r in rows.items():
            a = r["redline"]
            c = r.get("llama.cpp", {"kl": float("nan"), "top1": float("nan")})
            differ = "; ".join(d for d in r["differ_from_first"]
                               if len(set(d.split(": ")[1].split(" vs "))) == 2) or "–"
            print(f"| {ty} | {mix} | {r['tensor_bytes'] / 2**20:.3f} | {r['bpw']:.3f} "
                  f"| {r['rel_rmse']:.5f} | {a['kl']:.5f} | {a['top1']:.2f} | {a['ppl']:.2f} "
                  f"| {c['kl']:.5f} | {c['top1']:.2f} | {differ} |")


if __name__ == "__main__":
    main()
