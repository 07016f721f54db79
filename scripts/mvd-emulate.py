#!/usr/bin/env python3
"""Host-side mirror of kernels/matvec_direct.cu `mvd_rows` (the direct Q4_K / IQ4_XS matvec,
REDLINE_MV_DIRECT), written in session 21 without a device, with the partial last iteration of
the `_t` kernels (idle lanes skipped). Q4_K: the lane mapping (lanes 8s..8s+7 on
super-block s, lane v on qs bytes [16v, 16v+16)), the pointer offsets (weights 576 bytes an
iteration, x 1024 values, its (d, d * sum) pairs 64 floats; the x pieces' places within a
512-value tile, tiled q8_1 or not), the packed 6-bit scales and mins with their prmt selectors
(sign replication as zero extension), the high nibbles at 16x, and the min terms split between the
two lanes of a pair. IQ4_XS: lane ib on sub-block ib (two 8-byte qs loads, the 8-byte header),
the 6-bit scale from scales_l / scales_h at lane-constant shifts, the kvalues_iq4nl lookup by
prmt left interleaved and x interleaved to match. Against gguf-py's dequantization (pip install
gguf numpy) dotted with the q8_1 values in f64. Run by hand: python3 scripts/mvd-emulate.py. The
GPU test gpu_matvec::direct_segments_match_cpu_reference checks the kernels themselves; this
checks the index math before a card is lent, and failed on the mutations it was tried with (Q4_K:
the selector of the upper sub-blocks, the min term's unit, the second x piece's place; IQ4_XS:
the scale shift, the x interleave).
"""
import numpy as np, gguf
from gguf.quants import dequantize
rng = np.random.default_rng(7)

def q8_1_at(i, tiled):
    return ((i & ~511) | ((i & 48) << 3) | ((i & 448) >> 2) | (i & 15)) if tiled else i

def prmt(a, b, sel):
    src = [(a >> (8*k)) & 0xFF for k in range(4)] + [(b >> (8*k)) & 0xFF for k in range(4)]
    r = 0
    for k in range(4):
        n = (sel >> (4*k)) & 0xF
        byte = src[n & 7]
        if n & 8:
            byte = 0xFF if byte & 0x80 else 0
        r |= byte << (8*k)
    return r

def dp4a_us(a, b_bytes):
    ua = [(a >> (8*k)) & 0xFF for k in range(4)]
    return sum(int(u)*int(s) for u, s in zip(ua, b_bytes))

def make_rows(nrows, ncols):
    nsb = ncols // 256
    blocks = []
    for _ in range(nrows * nsb):
        d = np.float16(rng.uniform(0.0005, 0.01)).tobytes()
        dmin = np.float16(rng.uniform(0.0005, 0.01)).tobytes()
        rest = rng.integers(0, 256, 140, dtype=np.uint8).tobytes()
        blocks.append(d + dmin + rest)
    return np.frombuffer(b''.join(blocks), dtype=np.uint8).reshape(nrows, nsb * 144)

def q8_1(x):
    q = np.zeros(x.size, np.int8); ds = np.zeros(x.size // 32 * 2, np.float32)
    for u in range(x.size // 32):
        v = x[32*u:32*u+32]
        amax = np.abs(v).max(); d = np.float32(amax / 127)
        qq = np.zeros(32) if amax == 0 else np.round(v / d)  # numpy rounds half to even
        q[32*u:32*u+32] = qq
        ds[2*u] = d; ds[2*u+1] = d * qq.sum()
    return q, ds

def kernel_row(wrow, xq_mem, ds, ncols, tiled):
    nit = (ncols + 1023) // 1024  # the last one partial where ncols % 1024 != 0 (the _t kernels)
    acc = np.zeros(32)
    for lane in range(32):
        sbl, v = lane >> 3, lane & 7
        j, h = v >> 1, v & 1
        i0 = (0 if j < 2 else 4) + 2 * (j & 1); i1 = i0 + 1
        sel0 = i0 | ((8 | i0) * 0x1110); sel1 = i1 | ((8 | i1) * 0x1110)
        selh = sel0 if h == 0 else sel1
        e0 = 256*sbl + 64*j + 16*h
        pa0, pb0 = q8_1_at(e0, tiled), q8_1_at(e0 + 32, tiled)
        pd0 = 2 * (8*sbl + 2*j)
        for it in range(nit):
            if 4 * it + sbl >= ncols // 256:
                continue  # an idle lane of the partial last iteration: zero weights and x
            hb = wrow[sbl*144 + 576*it: sbl*144 + 576*it + 16]
            qb = wrow[sbl*144 + 576*it + 16 + 16*v: sbl*144 + 576*it + 32 + 16*v]
            w32 = lambda b, k: int.from_bytes(bytes(b[4*k:4*k+4]), 'little')
            hd = [w32(hb, k) for k in range(4)]
            q = [w32(qb, k) for k in range(4)]
            xa = xq_mem[pa0 + 1024*it: pa0 + 1024*it + 16]
            xb = xq_mem[pb0 + 1024*it: pb0 + 1024*it + 16]
            dsv = ds[pd0 + 64*it: pd0 + 64*it + 4]
            d0, d1 = float(dsv[0]), float(dsv[2]) * 0.0625
            xs = float(dsv[1]) if h == 0 else float(dsv[3])
            d = float(np.frombuffer(bytes(hb[0:2]), np.float16)[0]); dmin = float(np.frombuffer(bytes(hb[2:4]), np.float16)[0])
            sc_lo = hd[1] & 0x3F3F3F3F; m_lo = hd[2] & 0x3F3F3F3F
            sc_hi = (hd[3] & 0x0F0F0F0F) | ((hd[1] >> 2) & 0x30303030)
            m_hi = ((hd[3] >> 4) & 0x0F0F0F0F) | ((hd[2] >> 2) & 0x30303030)
            sc0 = prmt(sc_lo, sc_hi, sel0); sc1 = prmt(sc_lo, sc_hi, sel1)
            mh = prmt(m_lo, m_hi, selh)
            s0 = sum(dp4a_us(q[i] & 0x0F0F0F0F, xa[4*i:4*i+4]) for i in range(4))
            s1 = sum(dp4a_us(q[i] & 0xF0F0F0F0, xb[4*i:4*i+4]) for i in range(4))
            f = d1 * (s1 * sc1) + d0 * (s0 * sc0)
            acc[lane] += d * f - dmin * mh * xs
    return acc.sum()

IQ4NL = [0xBFAD9881, 0xF6EADDCF, 0x26190D01, 0x71594535]

def dp4a_ss(a, b_bytes):
    sa = [((a >> (8*k)) & 0xFF) - (256 if (a >> (8*k)) & 0x80 else 0) for k in range(4)]
    return sum(int(u)*int(v) for u, v in zip(sa, b_bytes))

def make_rows_iq4xs(nrows, ncols):
    nsb = ncols // 256
    blocks = []
    for _ in range(nrows * nsb):
        d = np.float16(rng.uniform(0.0005, 0.01)).tobytes()
        rest = rng.integers(0, 256, 134, dtype=np.uint8).tobytes()
        blocks.append(d + rest)
    return np.frombuffer(b''.join(blocks), dtype=np.uint8).reshape(nrows, nsb * 136)

def kernel_row_iq4xs(wrow, xq_mem, ds, ncols, tiled):
    nit = (ncols + 1023) // 1024
    acc = 0.0
    w32 = lambda b, k: int.from_bytes(bytes(b[4*k:4*k+4]), 'little')
    for lane in range(32):
        sbl, ib = lane >> 3, lane & 7
        shl, shh = 4 * ib, 16 + 2 * ib
        e0 = 256*sbl + 32*ib
        pa0, pb0 = q8_1_at(e0, tiled), q8_1_at(e0 + 16, tiled)
        pd0 = 2 * (8*sbl + ib)
        for it in range(nit):
            if 4 * it + sbl >= ncols // 256:
                continue  # an idle lane of the partial last iteration: zero weights and x
            base = sbl*136 + 544*it
            hb = wrow[base: base + 8]
            qb = wrow[base + 8 + 16*ib: base + 24 + 16*ib]
            hx, hy = w32(hb, 0), w32(hb, 1)
            q = [w32(qb, k) for k in range(4)]
            xa = xq_mem[pa0 + 1024*it: pa0 + 1024*it + 16]
            xb = xq_mem[pb0 + 1024*it: pb0 + 1024*it + 16]
            xd = float(ds[pd0 + 64*it])
            xaw = [int.from_bytes(xa[4*i:4*i+4].tobytes(), 'little') for i in range(4)]
            xbw = [int.from_bytes(xb[4*i:4*i+4].tobytes(), 'little') for i in range(4)]
            p = []
            for i in range(4):
                p.append(prmt(xaw[i], xbw[i], 0x5140)); p.append(prmt(xaw[i], xbw[i], 0x7362))
            ls = ((hy >> shl) & 0xF) | (((hx >> shh) & 3) << 4)
            d = float(np.frombuffer(bytes(hb[0:2]), np.float16)[0])
            v = []
            for i in range(4):
                sel = q[i] & 0x77777777
                pick = ((q[i] >> 1) & 0x44444444) | 0x32103210
                for h in range(2):
                    a = prmt(IQ4NL[0], IQ4NL[1], sel >> (16*h))
                    b = prmt(IQ4NL[2], IQ4NL[3], sel >> (16*h))
                    v.append(prmt(a, b, pick >> (16*h)))
            s = sum(dp4a_ss(v[i], [(x if x < 128 else x - 256) for x in p[i].to_bytes(4, 'little')]) for i in range(8))
            acc += d * (ls - 32) * xd * s
    return acc

def check(fmt, make, kern, cases):
    for ncols, tiled in cases:
        nrows = 3
        W = make(nrows, ncols)
        wf = dequantize(W.reshape(-1), fmt).reshape(nrows, ncols).astype(np.float64)
        x = rng.standard_normal(ncols).astype(np.float32)
        q, ds = q8_1(x)
        xd = np.repeat(ds[0::2], 32).astype(np.float64) * q
        mem = np.zeros(ncols, np.int8)
        for i in range(ncols):
            mem[q8_1_at(i, tiled)] = q[i]
        for r in range(nrows):
            want = float(wf[r] @ xd)
            got = kern(W[r], mem, ds, ncols, tiled)
            mag = float(np.abs(wf[r] * xd).sum())
            # (the q8_1 d * sum q is an f32, as on the device: ~1e-7 of the terms)
            ok = abs(got - want) <= 2e-7 * mag + 1e-12
            print(f"{fmt.name} ncols {ncols} tiled {tiled} row {r}: kernel {got:.9f} reference {want:.9f} {'ok' if ok else 'MISMATCH'}")
            assert ok

check(gguf.GGMLQuantizationType.IQ4_XS, make_rows_iq4xs, kernel_row_iq4xs,
      [(1024, False), (1024, True), (2048, True), (768, False), (1536, True), (2304, False)])
check(gguf.GGMLQuantizationType.Q4_K, make_rows, kernel_row,
      [(1024, False), (1024, True), (3072, True), (2048, False), (256, False), (1536, True), (3584, True)])
print("all ok")
