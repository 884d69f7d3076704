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
import resource
import subprocess
import sys
import tempfile
import time

HEADS = 8
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- NumPy reference (runs in a child process) -----------------------------------------------

def numpy_attention(seqlen, head_dim, causal, threads, heads=HEADS, reps=1):
    """Forward and backward the way a NumPy user writes them: [B,H,S,S] scores in memory.
    With reps > 1 the forward+backward runs reps times and the fastest run counts."""
    import resource
    import numpy as np

    rng = np.random.default_rng(0)
    shape = (1, seqlen, heads, head_dim)
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
    t_step = c_step = float("inf")
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()  # process_time: every thread's CPU
        step()
        t_step = min(t_step, time.perf_counter() - t0)
        c_step = min(c_step, time.process_time() - c0)
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


def find_bench(relative=os.path.join("bench", "oracle_bench")):
    for d in sorted(os.listdir(os.path.join(ROOT, "build"))) if os.path.isdir(
            os.path.join(ROOT, "build")) else []:
        p = os.path.join(ROOT, "build", d, relative)
        if os.access(p, os.X_OK):
            return p
    return None


def cpu_isa():
    """The vector extensions the oracle's products can use, from /proc/cpuinfo's flags."""
    flags = set()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in ("avx2", "fma", "avx512f"))


# --- End to end: `attest oracle` as a user runs it ----------------------------------------------

E2E_HEADS, E2E_HEAD_DIM = 4, 128


def write_case(path, seqlen, causal, dtype):
    case = {"problem": {"batch": 1, "heads_q": E2E_HEADS, "heads_kv": E2E_HEADS,
                        "seqlen_q": seqlen, "seqlen_k": seqlen, "head_dim": E2E_HEAD_DIM,
                        "head_dim_v": E2E_HEAD_DIM, "dtype": dtype, "causal": causal},
            "generator": {"name": "gaussian", "seed": 1, "params": {}}}
    with open(path, "w") as fh:
        json.dump(case, fh)


def time_cli(cmd, out_path):
    """Wall and CPU seconds (the child's, all threads) of one `attest oracle` run, writing a
    file that did not exist before (as a first run does)."""
    if os.path.exists(out_path):
        os.unlink(out_path)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def run_e2e(args):
    bench = args.bench or find_bench()
    attest = args.attest or find_bench(os.path.join("tools", "attest", "attest"))
    if not bench or not attest:
        print("oracle_bench.py --e2e: build the oracle_bench and attest targets first, or pass "
              "--bench and --attest", file=sys.stderr)
        return 2
    seqlens = [int(x) for x in (args.seqlens or "2048,4096").split(",")]
    start = time.time()
    load_start = os.getloadavg()[0]
    rows, numpy_info, products = [], None, "?"
    with tempfile.TemporaryDirectory(prefix="oracle-e2e-") as tmp:
        for s in seqlens:
            for causal in (False, True):
                case = os.path.join(tmp, f"s{s}-{'causal' if causal else 'full'}.case.json")
                out = os.path.join(tmp, "out.safetensors")
                write_case(case, s, causal, args.dtype)
                cli_cmd = [attest, "oracle", "--case", case, "--out", out, "--threads",
                           str(args.threads), "--quiet"]
                bare_cmd = [bench, "attention", "--seqlen", str(s), "--head-dim",
                            str(E2E_HEAD_DIM), "--heads", str(E2E_HEADS), "--threads",
                            str(args.threads), "--skip-forward"] + (["--causal"] if causal else [])
                cli = bare = before = (float("inf"), float("inf"))
                rate = (0.0, 0.0)  # dgemm GFLOP/s, wall and per CPU second: the best seen
                for _ in range(args.reps):  # interleaved, so that all see the same load
                    g = run_json([bench, "dgemm", "--n", str(min(s, 2048)), "--threads",
                                  str(args.threads), "--reps", "2"])
                    rate = (max(rate[0], g["gflops"]), max(rate[1], g["gflops_per_cpu_second"]))
                    if args.attest_before:
                        w, c = time_cli([args.attest_before] + cli_cmd[1:], out)
                        before = (min(before[0], w), min(before[1], c))
                    w, c = time_cli(cli_cmd, out)
                    cli = (min(cli[0], w), min(cli[1], c))
                    b = run_json(bare_cmd)
                    products = b.get("products", products)
                    bare = (min(bare[0], b["seconds_fwd_bwd"]),
                            min(bare[1], b["cpu_seconds_fwd_bwd"]))
                n = run_json([sys.executable, os.path.abspath(__file__), "--numpy-child",
                              str(s), str(E2E_HEAD_DIM), "1" if causal else "0", "--e2e",
                              "--threads", str(args.threads), "--heads", str(E2E_HEADS),
                              "--reps", str(args.reps)], env=numpy_env(args.threads))
                numpy_info = n
                rows.append((s, causal, cli, bare, n, before, rate))
    load_end = os.getloadavg()[0]
    lines = [
        "# `attest oracle` end to end",
        "",
        f"`bench/oracle_bench.py --e2e` on {platform.node() or 'this machine'} ({cpu_model()}; "
        f"{cpu_isa()}; the oracle's products: the {products} version; "
        f"{len(os.sched_getaffinity(0))} of {os.cpu_count()} cores usable), {args.threads} "
        f"threads everywhere, B=1, H={E2E_HEADS}, D={E2E_HEAD_DIM}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, fastest of {args.reps} runs "
        "each, CLI and bare call interleaved. CLI: `attest oracle --case F --out "
        f"F.safetensors` as a user runs it (a {args.dtype} case with the gaussian generator; "
        "process start, case, input generation and rounding, the oracle, the error bounds, the "
        "file written, fsynced and renamed into place). Bare: the fwd+bwd call alone "
        "(`oracle_bench attention --skip-forward`, inputs made before the clock starts). "
        "NumPy: the float64 forward+backward with materialised scores, inputs made before the "
        "clock starts. CPU columns: CPU seconds of every thread. Bound: NumPy's time over "
        "T_min, the time of NumPy's own six products (12·S²·D·H flops, half of them causal) at "
        "dgemm's rate measured in the same loop (N = min(S, 2048), the best of the runs): no "
        "oracle that does those products at dgemm's rate beats NumPy by more (the oracle does "
        "the same six, keeping the forward's scores).",
        "",
        "| S | mask | CLI s | bare call s | CLI / bare | NumPy s | NumPy / CLI "
        "| CLI CPU s | bare CPU s | CLI / bare CPU | NumPy CPU s | NumPy / CLI CPU "
        "| dgemm GFLOP/s | bound on NumPy / CLI | bound, CPU |"
        + (" CLI before s | before / now | CLI before CPU s | before / now CPU |"
           if args.attest_before else ""),
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        + ("---:|---:|---:|---:|" if args.attest_before else ""),
    ]
    for s, causal, cli, bare, n, before, rate in rows:
        gflop = 12.0 * s * s * E2E_HEAD_DIM * E2E_HEADS * (0.5 if causal else 1.0) * 1e-9
        lines.append(
            f"| {s} | {'causal' if causal else 'none'} | {cli[0]:.2f} | {bare[0]:.2f} | "
            f"{cli[0] / bare[0]:.2f} | {n['seconds_fwd_bwd']:.2f} | "
            f"{n['seconds_fwd_bwd'] / cli[0]:.2f} | {cli[1]:.2f} | {bare[1]:.2f} | "
            f"{cli[1] / bare[1]:.2f} | {n['cpu_seconds_fwd_bwd']:.2f} | "
            f"{n['cpu_seconds_fwd_bwd'] / cli[1]:.2f} | {rate[0]:.1f} | "
            f"{n['seconds_fwd_bwd'] / (gflop / rate[0]):.2f} | "
            f"{n['cpu_seconds_fwd_bwd'] / (gflop / rate[1]):.2f} |"
            + (f" {before[0]:.2f} | {before[0] / cli[0]:.2f} | {before[1]:.2f} | "
               f"{before[1] / cli[1]:.2f} |" if args.attest_before else ""))
    lines.append("")
    if args.attest_before:
        lines.append(f"CLI before: the same command run by `{args.attest_before}`, in turn with "
                     "the others.")
    if numpy_info:
        lines.append(f"NumPy {numpy_info['numpy']}, BLAS: {numpy_info['blas']} "
                     "(OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for NumPy only).")
    lines.append(f"Total wall time {time.time() - start:.0f} s; 1-minute load average "
                 f"{load_start:.1f} at the start, {load_end:.1f} at the end (above "
                 f"{os.cpu_count()}, the machine's core count, other work shared the cores).")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as fh:
            fh.write(text)
    return 0


def grid_table(args, rows, skipped, numpy_info, cores, start, load_start):
    """The grid's Markdown table with its header lines (what --out writes)."""
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
    return "\n".join(lines) + "\n"


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", help="path of the oracle_bench executable")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seqlens", help="default 1024,2048,4096,8192 (2048,4096 with --e2e)")
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
    ap.add_argument("--e2e", action="store_true",
                    help="end to end instead of the grid: `attest oracle` on a case file beside "
                         "the bare fwd+bwd call and NumPy (B=1, H=4, D=128; --seqlens default "
                         "2048,4096)")
    ap.add_argument("--attest", help="path of the attest executable (--e2e)")
    ap.add_argument("--attest-before", metavar="PATH",
                    help="--e2e: also time this attest executable (an older build), interleaved "
                         "with the others, for a before / after column")
    ap.add_argument("--reps", type=int, default=3,
                    help="--e2e: runs of each contender per cell, the fastest counts")
    ap.add_argument("--dtype", default="bf16", help="--e2e: the case's input dtype")
    ap.add_argument("--numpy-child", nargs=3, metavar=("S", "D", "CAUSAL"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--heads", type=int, default=HEADS, help=argparse.SUPPRESS)
    return ap.parse_args()


def main():
    args = parse_args()

    if args.numpy_child:
        s, d, c = args.numpy_child
        print(json.dumps(numpy_attention(int(s), int(d), c == "1", args.threads, args.heads,
                                         args.reps if args.e2e else 1)))
        return 0
    if args.e2e:
        return run_e2e(args)

    bench = args.bench or find_bench()
    if not bench:
        print("oracle_bench.py: build the oracle_bench target first, or pass --bench", file=sys.stderr)
        return 2
    seqlens = [int(x) for x in (args.seqlens or "1024,2048,4096,8192").split(",")]
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

    text = grid_table(args, rows, skipped, numpy_info, cores, start, load_start)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
