#!/usr/bin/env python3
"""Writes a random-init Qwen3.5 Hugging Face folder with the 27B's proportions at small width.

The Qwen3.5 fixture (4 layers, GQA 2) is too shallow for llama.cpp's layer-position rules
(`use_more_bits` over 4 tensors) and takes none of the GQA >= 4 branches that the real 27B
(GQA 6) takes. This model keeps the fixture's recipe (weights N(0, 1/fan_in), Qwen3.5 norms
stored as w with the model using 1 + w, w ~ N(0, 0.1); its tokenizer) with the 27B's ratios:

  27B:   n_embd 5120, 64 layers (every 4th full attention), 24 q / 4 kv heads x 256,
         DeltaNet 16 key / 48 value heads x 128 (attn_qkv 2 n_embd rows), n_ff 3.4 n_embd
  here:  n_embd 512, 16 layers (every 4th full attention), 8 q / 2 kv heads x 64 (GQA 4),
         DeltaNet 4 key / 12 value heads x 64 (attn_qkv 1280 rows), n_ff 1792 (3.5 n_embd)

Every row length is a multiple of 256, so K-quants apply without fallback as in the 27B.
No torch needed (numpy + the safetensors layout written by hand). Convert with
`redline convert OUT_DIR -o model-f32.gguf` (or llama.cpp's convert_hf_to_gguf.py).

  python3 scripts/make-qwen35-synth-hf.py OUT_DIR [--seed 7] [--layers 16]
"""

import argparse
import json
import os
import shutil
import struct

import numpy as np

FIXTURE_HF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
                          "fixtures-hf", "qwen35")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--tokenizer-from", default=FIXTURE_HF,
                    help="folder with the fixture's tokenizer.json / tokenizer_config.json")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)

    e, n_ff, vocab = 512, 1792, 512
    n_head, n_kv, hd = 8, 2, 64
    nk, nv, dk, dv, conv_k = 4, 12, 64, 64, 4
    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                   for i in range(a.layers)]

    tensors = {}

    def mat(name, rows, cols):  # HF [out, in], N(0, 1/in)
        tensors[name] = (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def vec(name, n, mean=0.0, std=0.1):
        tensors[name] = (mean + std * rng.standard_normal(n)).astype(np.float32)

    mat("model.embed_tokens.weight", vocab, e)
    mat("lm_head.weight", vocab, e)
    vec("model.norm.weight", e)
    for i, kind in enumerate(layer_types):
        p = f"model.layers.{i}."
        vec(p + "input_layernorm.weight", e)
        vec(p + "post_attention_layernorm.weight", e)
        mat(p + "mlp.gate_proj.weight", n_ff, e)
        mat(p + "mlp.up_proj.weight", n_ff, e)
        mat(p + "mlp.down_proj.weight", e, n_ff)
        if kind == "full_attention":
            mat(p + "self_attn.q_proj.weight", 2 * n_head * hd, e)  # query + output gate
            mat(p + "self_attn.k_proj.weight", n_kv * hd, e)
            mat(p + "self_attn.v_proj.weight", n_kv * hd, e)
            mat(p + "self_attn.o_proj.weight", e, n_head * hd)
            vec(p + "self_attn.q_norm.weight", hd)
            vec(p + "self_attn.k_norm.weight", hd)
        else:
            ch = 2 * nk * dk + nv * dv
            mat(p + "linear_attn.in_proj_qkv.weight", ch, e)
            mat(p + "linear_attn.in_proj_z.weight", nv * dv, e)
            mat(p + "linear_attn.in_proj_a.weight", nv, e)
            mat(p + "linear_attn.in_proj_b.weight", nv, e)
            mat(p + "linear_attn.out_proj.weight", e, nv * dv)
            tensors[p + "linear_attn.conv1d.weight"] = (
                rng.standard_normal((ch, 1, conv_k)) / np.sqrt(conv_k)).astype(np.float32)
            # A = exp(A_log) in [1, 16) as transformers initialises it; dt_bias small.
            tensors[p + "linear_attn.A_log"] = np.log(rng.uniform(1, 16, nv)).astype(np.float32)
            vec(p + "linear_attn.dt_bias", nv)
            vec(p + "linear_attn.norm.weight", dv, mean=1.0)

    os.makedirs(a.out, exist_ok=True)
    header, offset = {}, 0
    for name, t in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    hj = json.dumps(header).encode()
    hj += b" " * (-len(hj) % 8)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for t in tensors.values():
            f.write(np.ascontiguousarray(t).tobytes())

    with open(os.path.join(a.tokenizer_from, "config.json")) as f:
        cfg = json.load(f)
    cfg.update({
        "hidden_size": e, "intermediate_size": n_ff, "num_hidden_layers": a.layers,
        "layer_types": layer_types, "num_attention_heads": n_head, "num_key_value_heads": n_kv,
        "head_dim": hd, "linear_num_key_heads": nk, "linear_num_value_heads": nv,
        "linear_key_head_dim": dk, "linear_value_head_dim": dv,
        "linear_conv_kernel_dim": conv_k, "vocab_size": vocab,
    })
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        src = os.path.join(a.tokenizer_from, name)
        if os.path.exists(src):
            shutil.copy(src, os.path.join(a.out, name))
    n = sum(t.size for t in tensors.values())
    print(f"{a.out}: {len(tensors)} tensors, {n / 1e6:.1f} M weights")


if __name__ == "__main__":
    main()
