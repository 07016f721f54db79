#!/usr/bin/env python3
"""Generate gguf-py reference vectors for crates/quant/tests/gguf_py_vectors.rs.

Oracle: the PyPI `gguf` package (gguf-py, gguf/quants.py) on numpy.
Generated with: gguf==0.19.0, numpy==2.4.6, Python 3.11.7
    pip install gguf==0.19.0 numpy==2.4.6
    python3 scripts/gen_quant_vectors.py            # writes tests/data/quant/*.bin

Files (all integers little-endian):
  dequant_<type>.bin: b"RLQV", u32 version=1, u32 ggml type id, u32 n_elements, u32 n_bytes,
                      n_bytes quantized blocks, n_elements f32 = gguf.quants.dequantize(blocks)
  quant_<type>.bin:   b"RLQQ", u32 version=1, u32 ggml type id, u32 n_elements, u32 n_bytes,
                      n_elements f32 input, n_bytes = gguf.quants.quantize(input)

Dequantize inputs are random blocks whose f16 scale fields are finite (random finite bit
patterns, typical magnitudes, and specials: +-0, smallest subnormal, largest subnormal,
smallest normal, +-max finite); the other bytes (packed scales, quants) are random, with some
blocks all-0x00 or all-0xFF. No NaN / Inf.

Quantize inputs are rows of blocks: Gaussian at many magnitudes, tiny (down to 1e-30, where
the f16 scale underflows), huge (up to 1e7, where the f16 scale overflows to inf), all-zero,
constant, and exact ties (x * id + 0.5 exactly an integer, |max| ties between signs). -0.0 is
avoided (numpy's min/max reductions do not specify which zero they return), as are inputs
so small that 1/d overflows (numpy's float->uint8 cast of inf is platform-defined).
F16 / BF16 inputs probe rounding: exact halfway points (ties to even), subnormals, overflow
to inf; BF16 also gets +-inf and NaN payloads (gguf-py forces NaN quiet), F16 no NaN
(numpy and ggml treat NaN payloads differently).
"""

import importlib.metadata
import struct
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize, dequantize

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "quant"
rng = np.random.default_rng(0x5EED)

# (type, block bytes, offsets of f16 fields, n_blocks)
DEQUANT_TYPES = [
    (T.Q4_0, 18, [0], 256),
    (T.Q4_1, 20, [0, 2], 256),
    (T.Q5_0, 22, [0], 256),
    (T.Q5_1, 24, [0, 2], 256),
    (T.Q8_0, 34, [0], 256),
    (T.Q2_K, 84, [80, 82], 32),
    (T.Q3_K, 110, [108], 32),
    (T.Q4_K, 144, [0, 2], 32),
    (T.Q5_K, 176, [0, 2], 32),
    (T.Q6_K, 210, [208], 32),
    (T.IQ4_NL, 18, [0], 256),
    (T.IQ4_XS, 136, [0], 32),
]

F16_SPECIALS = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x8400,
                0x7BFF, 0xFBFF, 0x3C00, 0xBC00]


def rand_f16_bits(n: int) -> np.ndarray:
    """n finite f16 bit patterns: uniform over all finite patterns, typical, or special."""
    out = np.empty(n, dtype=np.uint16)
    kind = rng.integers(0, 10, size=n)
    for i in range(n):
        if kind[i] < 4:
            sign = int(rng.integers(0, 2)) << 15
            exp = int(rng.integers(0, 31)) << 10
            man = int(rng.integers(0, 1024))
            out[i] = sign | exp | man
        elif kind[i] < 8:
            v = np.float16(rng.normal() * 10.0 ** rng.uniform(-4, 0))
            out[i] = np.array(v, dtype=np.float16).view(np.uint16)
        else:
            out[i] = F16_SPECIALS[int(rng.integers(0, len(F16_SPECIALS)))]
    assert np.all((out & 0x7C00) != 0x7C00)
    return out


def write(path: Path, magic: bytes, ty: int, n_elements: int, first: bytes, second: bytes):
    n_bytes = len(first) if magic == b"RLQV" else len(second)  # the quantized side
    with open(path, "wb") as f:
        f.write(magic + struct.pack("<IIII", 1, ty, n_elements, n_bytes))
        f.write(first)
        f.write(second)


def gen_dequant():
    for ty, type_size, f16_offsets, n_blocks in DEQUANT_TYPES:
        block_size, ts = gguf.GGML_QUANT_SIZES[ty]
        assert ts == type_size
        blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
        fill = rng.integers(0, 20, size=n_blocks)
        blocks[fill == 0] = 0x00
        blocks[fill == 1] = 0xFF
        for off in f16_offsets:
            blocks[:, off:off + 2] = rand_f16_bits(n_blocks).view(np.uint8).reshape(n_blocks, 2)
        out = dequantize(blocks.reshape(-1), ty)
        assert out.dtype == np.float32 and out.shape == (n_blocks * block_size,)
        assert np.all(np.isfinite(out))
        write(OUT / f"dequant_{ty.name.lower()}.bin", b"RLQV", int(ty), out.size,
              blocks.tobytes(), out.astype("<f4").tobytes())

    # F32 / F16 / BF16: finite bit patterns plus specials.
    n = 4096
    f32 = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32)
    f32 = np.where((f32 & 0x7F800000) == 0x7F800000, f32 & 0xBFFFFFFF, f32).astype(np.uint32)
    f32[:6] = [0x00000000, 0x80000000, 0x00000001, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000]
    f16 = rand_f16_bits(n)
    bf16 = rng.integers(0, 2**16, size=n, dtype=np.uint32).astype(np.uint16)
    bf16 = np.where((bf16 & 0x7F80) == 0x7F80, bf16 & 0xBFFF, bf16).astype(np.uint16)
    bf16[:6] = [0x0000, 0x8000, 0x0001, 0x7F7F, 0xFF7F, 0x3F80]
    for ty, raw in [(T.F32, f32.astype("<u4")), (T.F16, f16.astype("<u2")), (T.BF16, bf16.astype("<u2"))]:
        data = np.frombuffer(raw.tobytes(), dtype=np.uint8)
        if ty == T.F32:
            out = dequantize(data.view(np.float32), ty)
        elif ty == T.F16:
            out = dequantize(data.view(np.uint8), ty)
        else:
            out = dequantize(data, ty)
        out = np.asarray(out, dtype=np.float32).reshape(-1)
        assert out.size == n and np.all(np.isfinite(out))
        write(OUT / f"dequant_{ty.name.lower()}.bin", b"RLQV", int(ty), n,
              raw.tobytes(), out.astype("<f4").tobytes())


def quant_rows_blocks(n_blocks: int) -> np.ndarray:
    """n_blocks blocks of 32 f32 values, one kind of test block per block."""
    rows = []
    for b in range(n_blocks):
        kind = b % 10
        if kind <= 2:  # Gaussian at a random magnitude
            x = rng.normal(size=32) * 10.0 ** rng.uniform(-4, 4)
        elif kind == 3:  # tiny: f16 scale underflows to subnormal / zero
            x = rng.normal(size=32) * 10.0 ** rng.uniform(-30, -5)
        elif kind == 4:  # huge: f16 scale overflows to inf
            x = rng.normal(size=32) * 10.0 ** rng.uniform(4, 7)
        elif kind == 5:  # all zero
            x = np.zeros(32)
        elif kind == 6:  # constant
            x = np.full(32, rng.normal() * 10.0 ** rng.uniform(-3, 3))
        elif kind == 7:  # half-integer grid with an exact |max| of 8 / 16 / 127 (ties)
            top = [8.0, 16.0, 127.0, 15.0, 31.0][int(rng.integers(0, 5))]
            x = rng.integers(-2 * int(top), 2 * int(top) + 1, size=32) * 0.5
            x = np.clip(x, -top, top)
            x[int(rng.integers(0, 32))] = -top if rng.integers(0, 2) else top
        elif kind == 8:  # +m and -m both present: first |max| wins
            x = rng.uniform(-1, 1, size=32)
            m = float(rng.uniform(1, 5))
            i, j = rng.choice(32, size=2, replace=False)
            x[i], x[j] = m, -m
        else:  # uniform with a few outliers
            x = rng.uniform(-1, 1, size=32)
            x[rng.integers(0, 32, size=3)] *= 100
        rows.append(x)
    x = np.concatenate(rows).astype(np.float32)
    x[x == 0] = 0.0  # no -0.0
    return x


def float_specials(n: int, ty) -> np.ndarray:
    """Values probing f32 -> f16 / bf16 rounding: ties, subnormals, overflow."""
    parts = [rng.normal(size=n // 4).astype(np.float32) * np.float32(10.0) ** rng.uniform(-8, 8, size=n // 4).astype(np.float32)]
    if ty == T.F16:
        # exact halfway points between adjacent f16 values (normal and subnormal), +- 1 ulp
        h = rng.integers(0, 0x7BFF, size=n // 8).astype(np.uint16)
        lo = h.view(np.float16).astype(np.float32)
        hi = (h + 1).astype(np.uint16).view(np.float16).astype(np.float32)
        mid = (lo + hi) / np.float32(2)  # exact in f32
        parts += [mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(0)), -mid]
        parts.append(np.array([65504.0, 65519.0, 65520.0, 70000.0, 1e30, -65520.0, 6e-8, 2.9802322e-08,
                               2.9802326e-08, 5.9604645e-08, 1e-9, 0.0], dtype=np.float32))
    else:
        bits = rng.integers(0, 2**32, size=n // 2, dtype=np.uint64).astype(np.uint32)
        ties = (bits & np.uint32(0xFFFF0000)) | np.uint32(0x8000)  # exactly halfway
        parts += [bits.view(np.float32), ties.view(np.float32)]
        parts.append(np.array([np.inf, -np.inf, np.nan, 3.4028235e38, -3.4028235e38, 1e-45, 0.0],
                              dtype=np.float32))
        parts.append(np.array([0x7F800001, 0xFFC00000, 0x7FBFFFFF, 0x7FFFFFFF], dtype=np.uint32).view(np.float32))
    x = np.concatenate(parts).astype(np.float32)
    x[x == 0] = 0.0
    return x


def gen_quant():
    for ty in [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]:
        x = quant_rows_blocks(256)
        with np.errstate(over="ignore"):
            q = quantize(x.reshape(4, -1), ty)
        q = np.asarray(q).view(np.uint8).reshape(-1)
        write(OUT / f"quant_{ty.name.lower()}.bin", b"RLQQ", int(ty), x.size,
              x.astype("<f4").tobytes(), q.tobytes())
    for ty in [T.F16, T.BF16]:
        x = float_specials(2048, ty)
        if ty == T.F16:
            x = x[np.isfinite(x)]
        with np.errstate(over="ignore", invalid="ignore"):
            q = quantize(x.reshape(1, -1), ty)
        q = np.ascontiguousarray(q).view(np.uint8).reshape(-1)
        assert q.size == 2 * x.size
        write(OUT / f"quant_{ty.name.lower()}.bin", b"RLQQ", int(ty), x.size,
              x.astype("<f4").tobytes(), q.tobytes())


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    print(f"gguf {importlib.metadata.version('gguf')} numpy {np.__version__}", file=sys.stderr)
    gen_dequant()
    gen_quant()
    files = list(OUT.glob("dequant_*.bin")) + list(OUT.glob("quant_*.bin"))
    total = sum(p.stat().st_size for p in files)
    print(f"wrote {len(files)} files, {total} bytes to {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
