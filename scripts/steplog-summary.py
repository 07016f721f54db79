#!/usr/bin/env python3
"""Summarizes a server's REDLINE_STEP_LOG=1 stderr: scheduler steps grouped by the CUDA step mode
(none: not recorded, e.g. prompt chunks over 64 rows; Eager: a batch composition's first step;
Capture: its second; Replay), decode rows and whether prompt tokens rode along; for replayed
steps of exactly 1 and 8 decode rows, the CUDA step timing: the host walk before the (last)
launch and when the device was done, both from the step's opening."""
import collections
import re
import sys

STEP = re.compile(r"^step seqs=(\d+) decode=(\d+) prefill=(\d+) fwd_ms=([\d.]+) host_ms=([\d.]+)")
groups = collections.defaultdict(lambda: [0, 0.0, 0.0, 0, 0])  # steps, fwd ms, host ms, decode, prefill
modes = []
TIMING = re.compile(r"^cuda step timing: host ([\d.]+) ms .*device done at ([\d.]+) ms")
timing = None
walks = collections.defaultdict(list)  # decode rows -> [(host, done, model call ms)]
for line in open(sys.argv[1], errors="replace"):
    t = TIMING.match(line)
    if t:
        timing = (float(t[1]), float(t[2]))
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
    if mode == "Replay" and not pre and dec in (1, 8) and timing:
        walks[dec].append((timing[0], timing[1], fwd))
    timing = None
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
for dec, v in sorted(walks.items()):
    n = len(v)
    print(f"replayed {dec}-row steps: {n}, walk {sum(x[0] for x in v) / n:.3f} ms, device done at "
          f"{sum(x[1] for x in v) / n:.3f} ms, model call {sum(x[2] for x in v) / n:.3f} ms")
