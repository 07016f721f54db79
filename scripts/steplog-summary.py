#!/usr/bin/env python3
"""Summarizes a server's REDLINE_STEP_LOG=1 stderr: scheduler steps grouped by the CUDA step mode
(none: not recorded, e.g. prompt chunks over 64 rows; Eager: a batch composition's first step;
Capture: its second; Replay), decode rows and whether prompt tokens rode along."""
import collections
import re
import sys

STEP = re.compile(r"^step seqs=(\d+) decode=(\d+) prefill=(\d+) fwd_ms=([\d.]+) host_ms=([\d.]+)")
groups = collections.defaultdict(lambda: [0, 0.0, 0.0, 0, 0])  # steps, fwd ms, host ms, decode, prefill
modes = []
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("cuda step timing"):
        continue
    if line.startswith("cuda step "):
        modes.append(line.split()[2])
        continue
    m = STEP.match(line)
    if not m:
        continue
    seqs, dec, pre = int(m[1]), int(m[2]), int(m[3])
    fwd, host = float(m[4]), float(m[5])
    mode = "+".join(sorted(set(modes))) or "none"
    modes = []
    rows = "1" if dec <= 1 else "2-8" if dec <= 8 else "9-16" if dec <= 16 else "17-24" if dec <= 24 else "25-32" if dec <= 32 else ">32"
    g = groups[(mode, rows, "prompt" if pre else "-")]
    g[0] += 1
    g[1] += fwd
    g[2] += host
    g[3] += dec
    g[4] += pre
tot = sum(g[1] + g[2] for g in groups.values())
print("| mode | decode rows | prompt | steps | model ms (mean) | host ms (mean) | decode tok | prompt tok | share of time |")
print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for k, g in sorted(groups.items(), key=lambda kv: -(kv[1][1] + kv[1][2])):
    print(f"| {k[0]} | {k[1]} | {k[2]} | {g[0]} | {g[1] / g[0]:.2f} | {g[2] / g[0]:.2f} | {g[3]} | {g[4]} | "
          f"{100 * (g[1] + g[2]) / max(tot, 1e-9):.1f} % |")
print(f"total {tot / 1e3:.2f} s in {sum(g[0] for g in groups.values())} steps")
