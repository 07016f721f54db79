#!/usr/bin/env python3
"""Top SASS instructions by warp-stall samples in an `ncu --page source --csv --print-source sass`
dump (mmv2-ab.sh's ncu stage): each with its share of all samples and the stall-reason columns
that dominate it. Usage: ncu-top.py FILE.csv [N]"""
import csv
import sys


def num(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return 0.0


def main():
    path = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    with open(path, newline="") as f:
        lines = [l for l in f if l.count(",") > 3]
    rows = list(csv.reader(lines))
    if not rows:
        print("no rows in", path)
        return
    head = rows[0]
    print("columns:", " | ".join(head)[:1500])
    pick = [i for i, h in enumerate(head) if "Warp Stall Sampling (All" in h]
    if not pick:
        pick = [i for i, h in enumerate(head) if "Sampling" in h]
    if not pick:
        return
    si = pick[0]
    src = next((i for i, h in enumerate(head) if h.strip() in ("Source", "# Source")), 1)
    stall_cols = [i for i, h in enumerate(head) if h.startswith("stall_") or "Stall" in h and i != si]
    body = [r for r in rows[1:] if len(r) == len(head)]
    total = sum(num(r[si]) for r in body) or 1.0
    print(f"{len(body)} instructions, {total:.0f} samples")
    for r in sorted(body, key=lambda r: -num(r[si]))[:n]:
        reasons = sorted(((num(r[i]), head[i]) for i in stall_cols), reverse=True)[:3]
        rs = ", ".join(f"{h}={v:.0f}" for v, h in reasons if v > 0)
        print(f"{100 * num(r[si]) / total:5.1f}%  {r[src][:60]:60s}  {rs}")


main()
