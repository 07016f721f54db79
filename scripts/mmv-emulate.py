#!/usr/bin/env python3
"""Host-side emulations of three pieces of kernels/mmv.cu and common.cuh that no GPU checked when
they were written (session 16, no device lent). Run by hand: python3 scripts/mmv-emulate.py.

1. q6k_weights4: Q6_K weights as bytes 4 (q - 32), against the definition on random words.
2. mmv2_q6k's staging (load / stage / fragment): the warp's 16 rows copied by aligned 16-byte
   vectors, shifted 2 bytes where a super-block starts 2 mod 4, lanes 14-15 loading vector 13 and
   storing into the unused slot 14; every fragment word read back against memory, for row widths
   of 1..108 super-blocks, every even misalignment of the matrix, clamped last tiles.
3. Mv2Q4K's integer sums at 16x (high nibbles in place through the .u8 mma, low units at 16 x
   their scale): ai >> 4 equals the plain sum, and the worst case fits int32.
4. Mv2IQ4XS: each lane's A / B fragments (word t of each unit through the kvalues_iq4nl lookup,
   x's bytes 4t and 16 + 4t of token g), the PTX m16n8k32 fragment layout, and the scales from
   the header words, against the per-(row, token) integer sum of the block definition.

The GPU tests (gpu_mmq) check the kernels themselves against the CPU references; this checks the
reasoning behind the index math, and fails on the mutations it was tried with.
"""
import random

# ---- 1. q6k_weights4 ----------------------------------------------------------------------
M = 0xFFFFFFFF
def w4(ql, qh, k):
    lo = (ql >> 2) if (k >> 1) else ((ql << 2) & M)
    hi = (qh << (6 - 2 * k)) & M
    return ((lo & 0x3C3C3C3C) | (hi & 0xC0C0C0C0)) ^ 0x80808080
def w4_ref(ql, qh, k):
    out = 0
    for b in range(4):
        qlb = (ql >> (8 * b)) & 0xFF; qhb = (qh >> (8 * b)) & 0xFF
        nib = (qlb >> 4) if (k >> 1) else (qlb & 15)
        q = nib | (((qhb >> (2 * k)) & 3) << 4)
        out |= ((4 * (q - 32)) & 0xFF) << (8 * b)
    return out
random.seed(0)
for _ in range(200000):
    ql = random.getrandbits(32); qh = random.getrandbits(32); k = random.randrange(4)
    assert w4(ql, qh, k) == w4_ref(ql, qh, k), (hex(ql), hex(qh), k)
print("q6k_weights4: ok, 200000 words")

# ---- 2. mmv2_q6k staging --------------------------------------------------------------------
SB=210; VECS=15
def check(nsb, mis_base, nrows, row0, s):
    row_bytes = nsb*SB
    mem_len = 4096 + (row0+16)*row_bytes + 64
    mem = bytearray(random.getrandbits(8) for _ in range(mem_len))
    W = 1024 + mis_base            # matrix start (mis_base: its misalignment)
    tile = W + row0*row_bytes
    mis = tile & 15
    buf = [[None]*VECS for _ in range(16)]   # [row][slot] -> 16 bytes
    st = {}; shift2 = {}
    for lane in range(32):
        li = lane & 15; vi = min(li,13); hf = lane >> 4
        tile_v = tile - mis + 16*vi
        sh=0; vals=[]
        for k in range(8):
            roff = mis + (min(row0+2*k+hf, nrows-1)-row0)*row_bytes
            o = roff + s*SB
            sh |= ((o>>1)&1) << k
            addr = tile_v + (o & ~15)
            vals.append(bytes(mem[addr:addr+16]))
        st[lane]=vals; shift2[lane]=sh
    for k in range(8):
        for lane in range(32):
            li = lane & 15; hf = lane >> 4
            v = st[lane][k]
            nx = st[lane+1][k][:4] if lane < 31 else st[lane][k][:4]   # shfl_down by 1 (lane 31: own)
            if (shift2[lane]>>k)&1:
                w = v[2:] + nx[:2]
            else:
                w = v
            slot = min(li,14)
            buf[2*k+hf][slot] = w   # lanes 14, 15 both write slot 14
    # fragments
    for lane in range(32):
        g = lane>>2; t = lane&3
        for r in range(2):
            row = g + 8*r
            src = W + min(row0+row, nrows-1)*row_bytes
            o = ((src & 15) + s*SB) & 12
            rowbytes = b''.join(buf[row][i] if buf[row][i] is not None else b'\xee'*16 for i in range(VECS))
            sbstart = src + s*SB
            def frag(off):  # 4 bytes at offset off of the staged row vs memory
                return rowbytes[o+off:o+off+4], bytes(mem[sbstart+off:sbstart+off+4])
            offs=[64*(i>>2)+32*((i>>1)&1)+16*(i&1)+4*t for i in range(8)]
            offs+=[128+32*(i>>1)+16*(i&1)+4*t for i in range(4)]
            offs+=[192+4*i for i in range(4)]
            for off in offs:
                a,b = frag(off)
                assert a==b, (nsb, mis_base, row0, s, lane, r, off, a.hex(), b.hex())
            a,b = frag(208)
            assert a[:2]==b[:2], ('d', nsb, mis_base, row0, s, lane, r)
random.seed(1)
n=0
for nsb in [1,2,3,4,5,8,9,10,20,21,33,68,108]:
    for mis_base in [0,2,4,6,8,10,12,14]:
        for (nrows,row0) in [(16,0),(37,32),(523,512),(20,16)]:
            for s in sorted(set([0,1,2,3,nsb-1])):
                if s >= nsb: continue
                check(nsb, mis_base, nrows, row0, s); n+=1
print("mmv2_q6k staging: ok,", n, "cases")

# ---- 3. Mv2Q4K sums at 16x ------------------------------------------------------------------
random.seed(2)
for trial in range(20000):
    # one row, one token, one super-block: 8 units of 32 weights (4-bit), x int8, 6-bit scales
    q = [[random.randrange(16) for _ in range(32)] for u in range(8)]
    x = [[random.randrange(-127,128) for _ in range(32)] for u in range(8)]
    sc = [random.randrange(64) for u in range(8)]
    ref = sum(sc[u]*sum(q[u][i]*x[u][i] for i in range(32)) for u in range(8))
    ai = 0
    for u in range(8):
        if u & 1:
            c = sum((16*q[u][i])*x[u][i] for i in range(32))   # .u8 mma on nibbles in place
            ai += sc[u]*c
        else:
            c = sum(q[u][i]*x[u][i] for i in range(32))
            ai += (sc[u] << 4)*c
        assert -2**31 <= ai < 2**31
    assert ai % 16 == 0 and (ai >> 4) == ref, (ai, ref)
# extreme bound
qmax=[[15]*32]*8; xmax=[[127]*32]*8; scm=[63]*8
ai=sum((scm[u]<<4 if u%2==0 else scm[u])*sum((15*16 if u%2 else 15)*127 for i in range(32)) for u in range(8))
print("Mv2Q4K 16x sums: ok; worst |ai| =", ai, "< 2^31 =", 2**31)

# ---- 4. Mv2IQ4XS --------------------------------------------------------------------------
LUT=[-127,-104,-83,-65,-49,-35,-22,-10,1,13,25,38,53,69,89,113]
def s8(b): return b-256 if b>127 else b
random.seed(3)
for trial in range(300):
    n=random.randrange(1,9)
    # 16 rows of one super-block each: header (d ignored: integer part only), scales_h, scales_l, qs
    rows=[]
    for r in range(16):
        sh=random.getrandbits(16); sl=[random.getrandbits(8) for _ in range(4)]; qs=[random.getrandbits(8) for _ in range(128)]
        rows.append((sh,sl,qs))
    x=[[random.randrange(-127,128) for _ in range(256)] for tok in range(n)]
    # reference integer sums per (row, token)
    def ref(r,tok):
        sh,sl,qs=rows[r]; tot=0
        for ib in range(8):
            ls=((sl[ib//2]>>(4*(ib%2)))&0xF)|(((sh>>(2*ib))&3)<<4)
            acc=0
            for j in range(16):
                acc+=LUT[qs[16*ib+j]&0xF]*x[tok][32*ib+j]
                acc+=LUT[qs[16*ib+j]>>4]*x[tok][32*ib+j+16]
            tot+=(ls-32)*acc
        return tot
    # kernel emulation
    def hdr(r):
        sh,sl,qs=rows[r]
        hx=(0x3C00)|(sh<<16)          # d | scales_h << 16
        hy=sl[0]|(sl[1]<<8)|(sl[2]<<16)|(sl[3]<<24)
        return hx,hy
    def scale(h,u):
        hx,hy=h
        lo=(hy>>(4*u))&0xF; hi=(hx>>(16+2*u))&3
        return (lo|(hi<<4))-32
    def word(r,u,t):
        qs=rows[r][2]; return qs[16*u+4*t:16*u+4*t+4]
    def lookup8(wbytes):
        return [LUT[b&0xF] for b in wbytes],[LUT[b>>4] for b in wbytes]
    ai={}  # (lane) -> [4]
    for lane in range(32): ai[lane]=[0,0,0,0]
    for u in range(8):
        # fragments per lane
        A=[[None]*32 for _ in range(16)]; B=[[None]*8 for _ in range(32)]
        for lane in range(32):
            g=lane>>2; t=lane&3
            lo0,hi0=lookup8(word(g,u,t)); lo8,hi8=lookup8(word(g+8,u,t))
            tokg=min(g,n-1)
            b0=[x[tokg][32*u+4*t+i] for i in range(4)]; b1=[x[tokg][32*u+16+4*t+i] for i in range(4)]
            for i in range(4):
                A[g][4*t+i]=lo0[i]; A[g+8][4*t+i]=lo8[i]; A[g][16+4*t+i]=hi0[i]; A[g+8][16+4*t+i]=hi8[i]
                B[4*t+i][g]=b0[i]; B[16+4*t+i][g]=b1[i]
        C=[[sum(A[m][k]*B[k][c] for k in range(32)) for c in range(8)] for m in range(16)]
        for lane in range(32):
            g=lane>>2; t=lane&3
            sg=scale(hdr(g),u); s8_=scale(hdr(g+8),u)
            c=(C[g][2*t],C[g][2*t+1],C[g+8][2*t],C[g+8][2*t+1])
            a=ai[lane]; a[0]+=sg*c[0]; a[1]+=sg*c[1]; a[2]+=s8_*c[2]; a[3]+=s8_*c[3]
    for lane in range(32):
        g=lane>>2; t=lane&3
        for i,(row,tok) in enumerate([(g,2*t),(g,2*t+1),(g+8,2*t),(g+8,2*t+1)]):
            if tok<n:
                assert ai[lane][i]==ref(row,tok),(trial,lane,i)
print("Mv2IQ4XS fragments and scales: ok, 300 warps")
