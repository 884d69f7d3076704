#!/usr/bin/env python3
"""Oracle benchmark (docs/bench-oracle.md): float64 oracle fwd+bwd GFLOP/s and peak
memory beside OpenBLAS dgemm and a NumPy float64 attention written the usual way
(materialised score matrix), for B=1, H=8, S in {1024, 2048, 4096, 8192}, D in {64, 128},
causal and not. Prints one Markdown table (and writes it to --out when given).

  build/venv/bin/python3 bench/oracle_bench.py [--bench build/<dir>/bench/oracle_bench]
      [--threads 2] [--budget 600] [--seqlens 1024,2048,...] [--only S,D,full|causal]

FLOPs follow the usual convention: 14 S^2 D per head for forward + backward (4 forward:
Q K^T and P V; 10 backward: S recomputed, dP, dV, dQ, dK), halved for causal, also now that
the oracle keeps the forward's scores and computes 12 S^2 D (docs/bench-oracle.md). Every cell
runs in its own process; peak memory is that process's ru_maxrss (getrusage), so it
includes the inputs and the interpreter or program itself.

NumPy runs with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed from its environment (they
pin an old OpenBLAS kernel on this machine and slow a current NumPy: see the workplace env
notes) and OPENBLAS_NUM_THREADS / OMP_NUM_THREADS set to the same thread count as the
oracle; which BLAS it then uses is reported via threadpoolctl.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time

HEADS = 8
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- NumPy reference (runs in a child process) -----------------------------------------------

def numpy_attention(seqlen, head_dim, causal, threads):
    """Forward and backward the way a NumPy user writes them: [B,H,S,S] scores in memory."""
    import resource
    import numpy as np

    rng = np.random.default_rng(0)
    shape = (1, seqlen, HEADS, head_dim)
    q, k, v, do = (rng.standard_normal(shape) for _ in range(4))
    scale = 1.0 / np.sqrt(head_dim)

    def step():
        qh, kh, vh, doh = (x.transpose(0, 2, 1, 3) for x in (q, k, v, do))  # [B,H,S,D]
        s = scale * (qh @ kh.transpose(0, 1, 3, 2))                          # [B,H,S,S]
        if causal:
            s = np.where(np.tri(seqlen, dtype=bool), s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        p = np.exp(s - m)
        l = p.sum(axis=-1, keepdims=True)
        p /= l
        o = p @ vh
        lse = (m + np.log(l))[..., 0]
        # Backward: dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)), dQ, dK.
        dv = p.transpose(0, 1, 3, 2) @ doh
        dp = doh @ vh.transpose(0, 1, 3, 2)
        delta = (doh * o).sum(axis=-1, keepdims=True)
        ds = p * (dp - delta)
        dq = scale * (ds @ kh)
        dk = scale * (ds.transpose(0, 1, 3, 2) @ qh)
        return o, lse, dq, dk, dv

    def forward():
        qh, kh, vh = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
        s = scale * (qh @ kh.transpose(0, 1, 3, 2))
        if causal:
            s = np.where(np.tri(seqlen, dtype=bool), s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        p = np.exp(s - m)
        l = p.sum(axis=-1, keepdims=True)
        return (p / l) @ vh, (m + np.log(l))[..., 0]

    # Warm up BLAS threads and the allocator on a small slice, as the C++ side's first tile does.
    np.exp(q[:, :64] @ k[:, :64].transpose(0, 1, 3, 2))
    t0 = time.perf_counter()
    forward()
    t_fwd = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()  # process_time: every thread's CPU
    step()
    t_step, c_step = time.perf_counter() - t0, time.process_time() - c0
    blas = "unknown"
    try:
        from threadpoolctl import threadpool_info
        info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        if info:
            i = info[0]
            blas = f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')} " \
                   f"threads={i.get('num_threads')}"
    except ImportError:
        blas = "threadpoolctl not installed"
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return {"seconds_forward": t_fwd, "seconds_fwd_bwd": t_step, "cpu_seconds_fwd_bwd": c_step,
            "peak_rss_mib": peak_mib,
            "numpy": np.__version__, "blas": blas}


def numpy_peak_estimate_gib(seqlen):
    """Largest live set of numpy_attention: about five [H,S,S] float64 arrays at once."""
    return 5 * HEADS * seqlen * seqlen * 8 / 2**30


# --- Driver -----------------------------------------------------------------------------------

def flops(seqlen, head_dim, causal):
    return 14.0 * seqlen * seqlen * head_dim * HEADS * (0.5 if causal else 1.0)


def run_json(cmd, env=None, timeout=None):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def numpy_env(threads):
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    return env


def cpu_model():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def find_bench():
    for d in sorted(os.listdir(os.path.join(ROOT, "build"))) if os.path.isdir(
            os.path.join(ROOT, "build")) else []:
        p = os.path.join(ROOT, "build", d, "bench", "oracle_bench")
        if os.access(p, os.X_OK):
            return p
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", help="path of the oracle_bench executable")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seqlens", default="1024,2048,4096,8192")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--only", metavar="S,D,MASK",
                    help="run one cell, e.g. 4096,128,full (MASK: full/none or causal); "
                         "overrides --seqlens and --head-dims")
    ap.add_argument("--budget", type=float, default=600.0,
                    help="seconds; cells predicted to end past it are skipped")
    ap.add_argument("--numpy-max-gib", type=float, default=12.0,
                    help="skip NumPy cells whose score matrices need more than this")
    ap.add_argument("--out", help="also write the table (with its header lines) to this file; "
                                   "docs/bench-oracle.md quotes it by hand")
    ap.add_argument("--numpy-child", nargs=3, metavar=("S", "D", "CAUSAL"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.numpy_child:
        s, d, c = args.numpy_child
        print(json.dumps(numpy_attention(int(s), int(d), c == "1", args.threads)))
        return 0

    bench = args.bench or find_bench()
    if not bench:
        print("oracle_bench.py: build the oracle_bench target first, or pass --bench", file=sys.stderr)
        return 2
    seqlens = [int(x) for x in args.seqlens.split(",")]
    head_dims = [int(x) for x in args.head_dims.split(",")]
    start = time.time()
    load_start = os.getloadavg()[0]
    cores = len(os.sched_getaffinity(0))  # what taskset / the cgroup lets us use

    # Cells in order of size, so that a budget cut drops the largest ones; S=4096 D=128
    # (the acceptance cell) comes before any S=8192 cell.
    cells = [(s, d, c) for s in seqlens for d in head_dims for c in (False, True)]
    if args.only:
        try:
            s, d, mask = args.only.split(",")
            if mask not in ("full", "none", "causal"):
                raise ValueError(mask)
            cells = [(int(s), int(d), mask == "causal")]
        except ValueError:
            print(f"oracle_bench.py: --only wants S,D,full|causal, got '{args.only}'",
                  file=sys.stderr)
            return 2
    rows, skipped, numpy_info = [], [], None
    oracle_rate = numpy_rate = None  # observed GFLOP/s, to predict whether a cell fits
    for s, d, causal in cells:
        cell = f"S={s} D={d} {'causal' if causal else 'full'}"
        f = flops(s, d, causal)
        # Oracle: one forward and one forward+backward, about (4 + 14) / 14 of f.
        predicted = 18.0 / 14.0 * f / (oracle_rate * 1e9) if oracle_rate else 0.0
        if time.time() - start + predicted > args.budget:
            skipped.append(f"{cell}: oracle predicted {predicted:.0f} s, past the "
                           f"{args.budget:.0f} s budget")
            continue
        # dgemm right before the cell, so both see the same machine load: square N x N with
        # N = min(S, 2048) (dgemm's rate has saturated there), the oracle's thread count.
        g = run_json([bench, "dgemm", "--n", str(min(s, 2048)), "--threads",
                      str(args.threads), "--reps", "2"])
        o = run_json([bench, "attention", "--seqlen", str(s), "--head-dim", str(d),
                      "--threads", str(args.threads)] + (["--causal"] if causal else []))
        oracle_rate = min(oracle_rate or 1e300, o["gflops_fwd_bwd"])
        n = None
        est = numpy_peak_estimate_gib(s)
        predicted = 1.5 * f / (numpy_rate * 1e9) if numpy_rate else 0.0
        if est > args.numpy_max_gib:
            skipped.append(f"{cell}: NumPy needs ~{est:.0f} GiB of score matrices "
                           f"(limit {args.numpy_max_gib:.0f} GiB on a 24 GiB machine)")
        elif time.time() - start + predicted > args.budget:
            skipped.append(f"{cell}: NumPy predicted {predicted:.0f} s, past the budget")
        else:
            n = run_json([sys.executable, os.path.abspath(__file__), "--numpy-child",
                          str(s), str(d), "1" if causal else "0",
                          "--threads", str(args.threads)], env=numpy_env(args.threads))
            numpy_info = n
            numpy_rate = min(numpy_rate or 1e300, f / n["seconds_fwd_bwd"] * 1e-9)
        rows.append((s, d, causal, o, n, g))

    lines = [
        "# Oracle benchmark",
        "",
        f"`bench/oracle_bench.py` on {platform.node() or 'this machine'} "
        f"({cpu_model()}; {cores} of {os.cpu_count()} cores "
        f"usable), {args.threads} threads everywhere, B=1, H=8, float64, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. GFLOP/s count "
        "14·S²·D per head for forward+backward (half for causal); dgemm is measured right "
        "before each cell (N = min(S, 2048)). The oracle's fwd+bwd is one "
        "`Backward<double>` call (it returns o and lse too); NumPy's is the materialised "
        "forward and backward. Memory is each process's peak RSS. The CPU columns use CPU "
        "seconds (all threads, getrusage / process_time) instead of wall seconds: time spent "
        "waiting for a core on a shared machine is not in them, so they compare the code "
        "rather than the load.",
        "",
        "| S | D | mask | oracle fwd s | oracle fwd+bwd s | oracle GFLOP/s | dgemm GFLOP/s "
        "| oracle/dgemm | oracle/dgemm CPU | oracle peak MiB | NumPy fwd+bwd s | NumPy GFLOP/s "
        "| NumPy peak MiB | NumPy/oracle time | NumPy/oracle CPU |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s, d, causal, o, n, g in rows:
        f = flops(s, d, causal)
        npcell = (f"{n['seconds_fwd_bwd']:.2f} | {f / n['seconds_fwd_bwd'] * 1e-9:.1f} | "
                  f"{n['peak_rss_mib']:.0f} | "
                  f"{n['seconds_fwd_bwd'] / o['seconds_fwd_bwd']:.2f} | "
                  f"{n['cpu_seconds_fwd_bwd'] / o['cpu_seconds_fwd_bwd']:.2f}"
                  ) if n else "skipped | — | — | — | —"
        cpu_ratio = o["gflops_per_cpu_second_fwd_bwd"] / g["gflops_per_cpu_second"]
        lines.append(
            f"| {s} | {d} | {'causal' if causal else 'none'} | {o['seconds_forward']:.2f} | "
            f"{o['seconds_fwd_bwd']:.2f} | {o['gflops_fwd_bwd']:.1f} | {g['gflops']:.1f} "
            f"(N={g['n']}) | {o['gflops_fwd_bwd'] / g['gflops']:.2f} | {cpu_ratio:.2f} "
            f"| {o['peak_rss_mib']:.0f} | {npcell} |")
    lines.append("")
    if rows:
        lines.append(f"dgemm: `{rows[0][5]['openblas_config']}`. The oracle's own products "
                     f"(reference/oracle/oracle_gemm.h): the "
                     f"{rows[0][3].get('products', '?')} version.")
    if numpy_info:
        lines.append(f"NumPy {numpy_info['numpy']}, BLAS: {numpy_info['blas']} "
                     "(OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for NumPy only).")
    if skipped:
        lines.append("")
        lines.append("Skipped:")
        lines.extend(f"- {x}" for x in skipped)
    lines.append("")
    lines.append(f"Total wall time {time.time() - start:.0f} s; 1-minute load average "
                 f"{load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (a load "
                 f"above {os.cpu_count()}, the machine's core count, means other work shared "
                 "the cores and the rates above are low by about that factor).")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
