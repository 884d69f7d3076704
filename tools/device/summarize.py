#!/usr/bin/env python3
"""Summarises `attest check --json` reports and `attest fuzz` reports of a GPU campaign
(tools/device/torch_campaign.sh) as the Markdown rows of docs/gpu-results.md: per run the exit
code, verdict and failure counts, the worst accuracy margin per tensor, and the failing checks
with their first message; per fuzz run the cases, failures and wall time.
Usage: summarize.py DIR...   (the unpacked stage folders)
"""

import glob
import json
import math
import os
import sys


def num(x):
    if isinstance(x, (int, float)):
        return float(x)
    if x in ("inf", "+inf"):
        return math.inf
    return math.nan


def gate_row(path):
    name = os.path.basename(path)[len("gate-"):-len(".json")]
    with open(path) as f:
        j = json.load(f)
    rc_file = path[:-len(".json")] + ".rc"
    rc, secs = (open(rc_file).read().split() + ["?", "?"])[:2] if os.path.exists(rc_file) else ("?", "?")
    verdicts = j.get("verdicts", [])
    failing = [v for v in verdicts if not v.get("pass")]
    worst = {}
    for v in verdicts:
        if v.get("check") == "accuracy" and v.get("pass"):
            t = v.get("tensor")
            worst[t] = max(worst.get(t, 0.0), num(v.get("margin")))
    margins = " / ".join(f"{worst[t]:.2f}" if t in worst else "—"
                         for t in ("o", "lse", "dq", "dk", "dv"))
    by_check = {}
    for v in failing:
        by_check.setdefault(v.get("check"), []).append(v)
    fails = "; ".join(f"{c} ×{len(vs)}" for c, vs in sorted(by_check.items()))
    return (f"| {name} | {rc} | {len(verdicts)} | {len(failing)} | {margins} | {secs} s | "
            f"{fails or '—'} |"), failing


def main():
    dirs = sys.argv[1:]
    print("| run | exit | verdicts | failing | worst passing accuracy margin (o / lse / dq / dk / dv) | wall | failing checks |")
    print("|---|---|---|---|---|---|---|")
    details = []
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "gate-*.json"))):
            row, failing = gate_row(path)
            print(row)
            seen = set()
            for v in failing:
                key = (v.get("check"), v.get("tensor"), v.get("message", "")[:80])
                if key in seen:
                    continue
                seen.add(key)
                details.append(f"- {os.path.basename(path)}: {v.get('check')} {v.get('tensor')}: "
                               f"{v.get('message', '')[:300]} — repro: {v.get('repro', '')[:300]}")
    print()
    print("| fuzz run | cases | failures | wall |")
    print("|---|---|---|---|")
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "fuzz-*", "fuzz-report.json"))):
            with open(path) as f:
                j = json.load(f)
            name = os.path.basename(os.path.dirname(path))
            print(f"| {name} | {j.get('cases', j.get('total_cases', '?'))} | "
                  f"{len(j.get('failures', []))} | {j.get('seconds', j.get('wall_seconds', '?'))} |")
    print()
    print("\n".join(details))


if __name__ == "__main__":
    main()
