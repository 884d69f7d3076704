#!/usr/bin/env python3
"""Summarises `attest check --json` reports and `attest fuzz` reports of a GPU campaign
(tools/device/torch_campaign.sh) as the Markdown rows of docs/gpu-results.md: per gate the exit
code, verdicts, failing verdicts (kernel errors among them) apart from the verdicts the time
budget left unrun, the worst passing accuracy margin per tensor and the failing checks; a gate
run as one process per check (GATE_SPLIT=1: gate-B-D-CHECK.json) is one row; per fuzz shard the
cases, failures and wall time; then each distinct failure with its repro line.
Usage: summarize.py DIR...   (the unpacked stage folders)
"""

import glob
import json
import math
import os
import re
import sys


def num(x):
    if isinstance(x, (int, float)):
        return float(x)
    if x in ("inf", "+inf"):
        return math.inf
    return math.nan


def not_run(v):
    return "time budget" in v.get("message", "")


def gate_name(path):
    """BACKEND-DTYPE of gate-BACKEND-DTYPE[-CHECK].json (one row for a per-check gate)."""
    name = os.path.basename(path)[len("gate-"):-len(".json")]
    m = re.match(r"(.*?-(?:bf16|f16|f32))(?:-.+)?$", name)
    return m.group(1) if m else name


def gate_row(name, paths):
    """The row, and the failing verdicts with the report file each came from."""
    rcs, secs, verdicts, source = [], 0, [], []
    for path in paths:
        with open(path) as f:
            vs = json.load(f).get("verdicts", [])
        verdicts += vs
        source += [os.path.basename(path)] * len(vs)
        rc_file = path[:-len(".json")] + ".rc"
        if os.path.exists(rc_file):
            parts = (open(rc_file).read().split() + ["?", "0"])[:2]
            rcs.append(parts[0])
            secs = max(secs, int(parts[1]) if parts[1].isdigit() else 0)
    failing = [(v, src) for v, src in zip(verdicts, source) if not v.get("pass") and not not_run(v)]
    unrun = sum(1 for v in verdicts if not v.get("pass") and not_run(v))
    errors = sum(1 for v, _ in failing if v.get("check") == "kernel-error")
    worst = {}
    for v in verdicts:
        if v.get("check") == "accuracy" and v.get("pass"):
            t = v.get("tensor")
            worst[t] = max(worst.get(t, 0.0), num(v.get("margin")))
    margins = " / ".join(f"{worst[t]:.2f}" if t in worst else "—"
                         for t in ("o", "lse", "dq", "dk", "dv"))
    by_check = {}
    for v, _ in failing:
        by_check.setdefault(v.get("check"), []).append(v)
    fails = "; ".join(f"{c} ×{len(vs)}" for c, vs in sorted(by_check.items()))
    exits = ",".join(sorted(set(rcs))) or "?"
    split = f" ({len(paths)} checks)" if len(paths) > 1 else ""
    return (f"| {name}{split} | {exits} | {len(verdicts)} | {len(failing)} ({errors}) | {unrun} | "
            f"{margins} | {secs} s | {fails or '—'} |"), failing


def main():
    dirs = sys.argv[1:]
    print("| run | exit | verdicts | failing (kernel-error) | not run (budget) | worst passing "
          "accuracy margin (o / lse / dq / dk / dv) | wall | failing checks |")
    print("|---|---|---|---|---|---|---|---|")
    details = []
    for d in dirs:
        groups = {}
        for path in sorted(glob.glob(os.path.join(d, "gate-*.json"))):
            groups.setdefault(gate_name(path), []).append(path)
        for name, paths in groups.items():
            row, failing = gate_row(name, paths)
            print(row)
            seen = set()
            for v, src in failing:
                key = (v.get("check"), v.get("tensor"), v.get("message", "")[:80])
                if key in seen:
                    continue
                seen.add(key)
                details.append(f"- {src}: {v.get('check')} {v.get('tensor')}: "
                               f"{v.get('message', '')[:300]} — repro: {v.get('repro', '')[:300]}")
    print()
    print("| fuzz run | cases | failures | wall |")
    print("|---|---|---|---|")
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "fuzz-*", "fuzz-report.json"))):
            with open(path) as f:
                j = json.load(f)
            name = os.path.basename(os.path.dirname(path))
            secs = j.get("seconds")
            print(f"| {name} | {j.get('cases_run', '?')} | {len(j.get('failures', []))} | "
                  f"{f'{secs:.0f} s' if isinstance(secs, (int, float)) else '?'} |")
    print()
    print("\n".join(details))


if __name__ == "__main__":
    main()
