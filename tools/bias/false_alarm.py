#!/usr/bin/env python3
"""The bias check's false-alarm rate on the correct CPU models (docs/checks.md "Bias").

Runs `attest check --kernel K --suite gate --check bias --seed S --json` for seeds
first..first+seeds-1 and every kernel given (default: every `cpu/` model of `attest list
kernels`), round robin over the kernels so that a run stopped early has covered them alike.
Only the bias check's rows run (each row's kernel calls, float64 oracle and recipe reference);
every correct model must pass every verdict, so each failing verdict is a false alarm. Each
run appends one JSON line to --out (resumable: seeds already there are skipped), and the
summary prints, per kernel and overall, the verdicts, the failures and the Clopper-Pearson
interval of the per-verdict false-alarm rate (Clopper and Pearson, Biometrika 26 (1934) 404),
and of the per-run rate (a gate run fails when any of its bias verdicts fails).

  tools/bias/false_alarm.py --attest build/default/tools/attest/attest --seeds 1000 \
      --out build/bias-false-alarm.jsonl [--kernel cpu/flash2-bf16 ...] [--summary-only]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time


def binom_cdf(k, n, p):
    """P(X <= k) for X ~ Binomial(n, p), summed in log space."""
    if p <= 0:
        return 1.0
    if p >= 1:
        return 1.0 if k >= n else 0.0
    total = 0.0
    for i in range(0, k + 1):
        log_term = (math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) +
                    i * math.log(p) + (n - i) * math.log1p(-p))
        total += math.exp(log_term)
    return min(total, 1.0)


def clopper_pearson(x, n, confidence=0.95):
    """The exact two-sided interval of a binomial proportion x / n."""
    if n == 0:
        return (0.0, 1.0)
    a = (1 - confidence) / 2

    def solve(f, target):  # f increasing in p on [0, 1]; bisection
        lo, hi = 0.0, 1.0
        for _ in range(200):
            mid = (lo + hi) / 2
            if f(mid) < target:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    lower = 0.0 if x == 0 else solve(lambda p: 1 - binom_cdf(x - 1, n, p), a)
    upper = 1.0 if x == n else solve(lambda p: -binom_cdf(x, n, p), -a)
    return (lower, upper)


def list_models(attest):
    out = subprocess.run([attest, "list", "kernels"], capture_output=True, check=True)
    text = out.stdout.decode("utf-8", errors="replace")  # descriptions are cut mid-character
    return [line.split()[0] for line in text.splitlines() if line.startswith("cpu/")]


def run_one(attest, kernel, seed):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "r.json")
        t0 = time.time()
        rc = subprocess.run([attest, "check", "--kernel", kernel, "--suite", "gate", "--check",
                             "bias", "--seed", str(seed), "--json", path],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
        seconds = time.time() - t0
        if rc not in (0, 1) or not os.path.exists(path):
            return {"kernel": kernel, "seed": seed, "rc": rc, "error": True, "seconds": seconds}
        report = json.load(open(path))
    verdicts = [v for v in report["verdicts"] if v["check"] == "bias"]
    failed = [v for v in verdicts if not v["pass"]]
    worst = max((v.get("margin", 0) or 0 for v in verdicts), default=0.0)
    abstained = sum(1 for s in report.get("skipped", []) if s.get("check") == "bias")
    return {"kernel": kernel, "seed": seed, "rc": rc, "verdicts": len(verdicts),
            "failed": len(failed), "worst_margin": worst, "abstained_rows": abstained,
            "failures": [{"tensor": v["tensor"], "margin": v["margin"], "case": v.get("case", "")}
                         for v in failed],
            "seconds": round(seconds, 3)}


def summarise(records):
    by_kernel = {}
    for r in records:
        by_kernel.setdefault(r["kernel"], []).append(r)
    rows = []
    totals = {"runs": 0, "verdicts": 0, "failed": 0, "failed_runs": 0, "errors": 0}
    for kernel in sorted(by_kernel):
        rs = [r for r in by_kernel[kernel] if not r.get("error")]
        errors = len(by_kernel[kernel]) - len(rs)
        v = sum(r["verdicts"] for r in rs)
        f = sum(r["failed"] for r in rs)
        fr = sum(1 for r in rs if r["failed"] > 0)
        worst = max((r["worst_margin"] for r in rs), default=0.0)
        seeds = sorted(r["seed"] for r in rs)
        rows.append((kernel, len(rs), seeds[0] if seeds else 0, seeds[-1] if seeds else 0, v, f,
                     clopper_pearson(f, v), fr, clopper_pearson(fr, len(rs)), worst, errors))
        for key, val in (("runs", len(rs)), ("verdicts", v), ("failed", f), ("failed_runs", fr),
                         ("errors", errors)):
            totals[key] += val
    return rows, totals


def print_summary(rows, totals):
    print("| kernel | gate runs (seeds) | bias verdicts | failed | false alarms per verdict, "
          "95 % CI | failed runs, 95 % CI | largest margin |")
    print("|---|---|---:|---:|---|---|---:|")
    for (k, runs, s0, s1, v, f, ci, fr, rci, worst, errors) in rows:
        note = f" ({errors} errors)" if errors else ""
        print(f"| `{k}` | {runs} ({s0}..{s1}){note} | {v} | {f} | [{ci[0]:.2g}, {ci[1]:.2g}] | "
              f"{fr} [{rci[0]:.2g}, {rci[1]:.2g}] | {worst:.3f} |")
    ci = clopper_pearson(totals["failed"], totals["verdicts"])
    rci = clopper_pearson(totals["failed_runs"], totals["runs"])
    print(f"| all | {totals['runs']} | {totals['verdicts']} | {totals['failed']} | "
          f"[{ci[0]:.2g}, {ci[1]:.2g}] | {totals['failed_runs']} [{rci[0]:.2g}, {rci[1]:.2g}] | |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attest", default="build/default/tools/attest/attest")
    ap.add_argument("--kernel", action="append", help="a kernel (repeatable; default: cpu/*)")
    ap.add_argument("--first", type=int, default=0, help="first run seed")
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument("--out", default="build/bias-false-alarm.jsonl")
    ap.add_argument("--budget-s", type=float, default=0, help="stop after this many seconds")
    ap.add_argument("--summary-only", action="store_true")
    args = ap.parse_args()

    records = []
    if os.path.exists(args.out):
        with open(args.out) as f:
            records = [json.loads(line) for line in f if line.strip()]
    if not args.summary_only:
        kernels = args.kernel or list_models(args.attest)
        done = {(r["kernel"], r["seed"]) for r in records}
        start = time.time()
        with open(args.out, "a") as out:
            for seed in range(args.first, args.first + args.seeds):
                for k in kernels:
                    if (k, seed) in done:
                        continue
                    if args.budget_s and time.time() - start > args.budget_s:
                        break
                    r = run_one(args.attest, k, seed)
                    records.append(r)
                    out.write(json.dumps(r, sort_keys=True) + "\n")
                    out.flush()
                    if r.get("failed") or r.get("error"):
                        print(f"{k} seed {seed}: {r}", file=sys.stderr)
                if args.budget_s and time.time() - start > args.budget_s:
                    break
    rows, totals = summarise(records)
    print_summary(rows, totals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
