#!/usr/bin/env python3
"""Summarize a block-timeline trace of one decode step (REDLINE_TRACE, crates/cuda/src/trace.rs).

Usage: trace-summary.py FILE [--seq N] [--skip M]

Prints (1) the launches of the step in order, M skipped then N shown, each with its first and
last block start, its first and last PDL-wait return and its last block end, in microseconds
from the step's first record; (2) per launch class (tag and grid size) the mean of: how long
before its wait it started (pre), the release latency (its first wait return after the previous
launch's last end), the run (last end after first wait return), and the tail (last end after
the first end); (3) the step's length and where it goes: the sum of the runs, of the release
latencies, and of the time no launch was past its wait.

Records: thread 0 of each block of the instrumented kernels (kernels/common.cuh TRACE_*):
event 0 start, 1 wait returned, 2 end, 3 and up a kernel's own marks (the attention decode: 4 its
K/V prefetches issued, 5 its RoPE angles computed, 3 its pre-wait work done; after the wait, 6
its query heads in place, 7 warp 0's positions done, 8 the warps' sums met; those also as the
mean time from the block's wait return).
"""
import struct
import sys
from collections import defaultdict

TAGS = {1: "mvd", 2: "f32rows", 3: "conv", 4: "delta", 5: "gnorm", 6: "norm", 7: "swiglu",
        8: "fa", 9: "fa_merge", 10: "head", 11: "quant", 12: "other", 13: "mvm"}


def read(path):
    data = open(path, "rb").read()
    assert data[:8] == b"RLTRACE1", "not a redline trace"
    sms, cap = struct.unpack_from("<II", data, 8)
    off = 16
    recs = []
    dropped = 0
    for sm in range(sms):
        (c,) = struct.unpack_from("<I", data, off)
        off += 4
        n = min(c, cap)
        dropped += c - n
        for i in range(n):
            t, w = struct.unpack_from("<QQ", data, off + 16 * i)
            recs.append((t, sm, w & 0xff, (w >> 8) & 0xff, (w >> 16) & 0xffffff, (w >> 40) & 0xffffff))
        off += 16 * n
    return recs, dropped


def instances(recs):
    """Pairs each block's events: key (tag, grid, block, sm), in time order."""
    by = defaultdict(list)
    for t, sm, tag, ev, block, grid in recs:
        by[(tag, grid, block, sm)].append((t, ev))
    out = []
    for (tag, grid, block, sm), evs in by.items():
        evs.sort()
        cur = None
        for t, ev in evs:
            if ev == 0:
                cur = {"tag": tag, "grid": grid, "block": block, "sm": sm, "start": t, "wait": None, "end": None}
            elif cur is not None and ev == 1:
                cur["wait"] = t
            elif cur is not None and ev >= 3:
                cur.setdefault("marks", {})[ev] = t
            elif cur is not None and ev == 2:
                cur["end"] = t
                out.append(cur)
                cur = None
    return out


def launches(insts):
    """Groups the instances of each (tag, grid) into launches of `grid` blocks by start time."""
    by = defaultdict(list)
    for i in insts:
        by[(i["tag"], i["grid"])].append(i)
    out = []
    for (tag, grid), lst in by.items():
        lst.sort(key=lambda i: i["start"])
        for k in range(0, len(lst), grid):
            blk = lst[k:k + grid]
            waits = [b["wait"] for b in blk if b["wait"] is not None]
            # per mark event: the mean time from a block's start to it
            evs = sorted({e for b in blk for e in b.get("marks", {})})
            marks = {e: [b["marks"][e] - b["start"] for b in blk if e in b.get("marks", {})] for e in evs}
            # and from its wait return, for the marks after the wait
            wmarks = {e: [b["marks"][e] - b["wait"] for b in blk
                          if e in b.get("marks", {}) and b["wait"] is not None and b["marks"][e] > b["wait"]]
                      for e in evs}
            out.append({
                "tag": tag, "grid": grid, "n": len(blk),
                "s0": min(b["start"] for b in blk), "s1": max(b["start"] for b in blk),
                "w0": min(waits) if waits else None, "w1": max(waits) if waits else None,
                "e0": min(b["end"] for b in blk), "e1": max(b["end"] for b in blk),
                "marks": {e: sum(v) / len(v) for e, v in marks.items()},
                "wmarks": {e: sum(v) / len(v) for e, v in wmarks.items() if v},
                "wend": [b["end"] - b["wait"] for b in blk if b["wait"] is not None and b["end"] > b["wait"]],
            })
    out.sort(key=lambda l: l["s0"])
    return out


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        sys.exit(2)
    path = args[0]
    seq = int(args[args.index("--seq") + 1]) if "--seq" in args else 40
    skip = int(args[args.index("--skip") + 1]) if "--skip" in args else 0
    recs, dropped = read(path)
    if not recs:
        print("no records")
        return
    times = sorted(r[0] for r in recs)
    # the timer's granularity: the smallest positive difference between record times
    diffs = sorted({b - a for a, b in zip(times, times[1:]) if b > a})
    print(f"{len(recs)} records, {dropped} dropped, timer step {diffs[0] if diffs else 0} ns")
    ls = launches(instances(recs))
    t0 = ls[0]["s0"]
    us = lambda t: "" if t is None else f"{(t - t0) / 1000:9.2f}"
    print(f"\n{len(ls)} launches; launches {skip}..{skip + seq}:")
    print(f"{'#':>4} {'kind':>9} {'grid':>6} {'start0':>9} {'start1':>9} {'wait0':>9} {'wait1':>9} "
          f"{'end0':>9} {'end1':>9} {'run':>7} {'release':>8}")
    prev = None
    for k, l in enumerate(ls):
        if skip <= k < skip + seq:
            run = (l["e1"] - (l["w0"] or l["s0"])) / 1000
            rel = "" if prev is None or l["w0"] is None else f"{(l['w0'] - prev['e1']) / 1000:8.2f}"
            print(f"{k:>4} {TAGS.get(l['tag'], l['tag']):>9} {l['grid']:>6} {us(l['s0'])} {us(l['s1'])} "
                  f"{us(l['w0'])} {us(l['w1'])} {us(l['e0'])} {us(l['e1'])} {run:7.2f} {rel:>8}")
        prev = l
    # per class
    cls = defaultdict(lambda: defaultdict(list))
    prev = None
    for l in ls:
        c = cls[(l["tag"], l["grid"])]
        w0 = l["w0"] if l["w0"] is not None else l["s0"]
        c["pre"].append((w0 - l["s0"]) / 1000)
        c["run"].append((l["e1"] - w0) / 1000)
        c["tail"].append((l["e1"] - l["e0"]) / 1000)
        c["startspread"].append((l["s1"] - l["s0"]) / 1000)
        if prev is not None:
            c["release"].append((w0 - prev["e1"]) / 1000)
        for e, v in l["marks"].items():
            c[f"mark{e}"].append(v / 1000)
        if l["wend"]:
            c["wmarkend"].append(sum(l["wend"]) / len(l["wend"]) / 1000)
        for e, v in l["wmarks"].items():
            c[f"wmark{e}"].append(v / 1000)
        prev = l
    print("\nper class (means, µs): count, pre (start to first wait return), release (first wait "
          "return after the previous launch's last end), run (first wait return to last end), "
          "tail (first end to last end), start spread (first to last block start)")
    print(f"{'kind':>9} {'grid':>6} {'count':>5} {'pre':>7} {'release':>8} {'run':>8} {'tail':>7} {'spread':>7} {'run sum':>9}")
    mean = lambda v: sum(v) / len(v) if v else 0.0
    for (tag, grid), c in sorted(cls.items(), key=lambda kv: -sum(kv[1]["run"])):
        print(f"{TAGS.get(tag, tag):>9} {grid:>6} {len(c['run']):>5} {mean(c['pre']):7.2f} "
              f"{mean(c['release']):8.2f} {mean(c['run']):8.2f} {mean(c['tail']):7.2f} "
              f"{mean(c['startspread']):7.2f} {sum(c['run']):9.1f}"
              + "".join(f"  (start to mark {k[4:]}: {mean(v):.2f})" for k, v in sorted(c.items())
                        if k.startswith("mark"))
              + "".join(f"  (wait to mark {k[5:]}: {mean(v):.2f})" for k, v in sorted(c.items())
                        if k.startswith("wmark")))
    step = (max(l["e1"] for l in ls) - t0) / 1000
    # time covered by some launch past its first wait return (the union of [w0, e1])
    iv = sorted(((l["w0"] if l["w0"] is not None else l["s0"]), l["e1"]) for l in ls)
    covered, cur_s, cur_e = 0, None, None
    for s, e in iv:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                covered += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    covered += cur_e - cur_s
    rel = sum(max(0.0, v) for c in cls.values() for v in c["release"])
    print(f"\nstep {step:.1f} µs from the first record to the last; launches past their wait "
          f"cover {covered / 1000:.1f} µs; release latencies sum to {rel:.1f} µs; "
          f"idle (no launch past its wait) {step - covered / 1000:.1f} µs")


if __name__ == "__main__":
    main()
