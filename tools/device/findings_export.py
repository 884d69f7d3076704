#!/usr/bin/env python3
"""Re-runs the findings of docs/findings/ on this host and exports each as a standalone repro
(`attest repro --export`), then runs every exported repro.py with a plain PyTorch interpreter:
the driver of tools/device/findings_export.sh (which sets the paths), also run on a CPU by ctest
findings_export_dry.

For each finding page (its ```json block: case_files, repro, check) whose backend passes
--backends, and for each of its case files: `attest repro --kernel K --case C [--check X]
--export DIR` with K the page's torch_worker.py command on --device (as
tools/device/torch_campaign.sh's kernel_of() builds it: `exec:<env> <python>
tools/workers/torch_worker.py --backend B --dtype D --device cuda`), then `<repro python>
repro.py` in DIR where one was written. Every process runs under a timeout in its own process
group (killed whole), --jobs cases at a time, and nothing starts past the CALL_SECONDS budget.
Writes findings-export.json (one record per case) and findings-export.txt (a table) under
--out, and the export folders under --out/export/.

The check passed to attest: the page's repro line's --check, else the one the case file's name
names (attest reads it), else gqa-mha where the page's check starts with it, else accuracy
(whose forward and backward also surface kernel errors).
"""

import argparse
import concurrent.futures as cf
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKS = ("accuracy", "gqa-mha", "determinism", "padding", "non-interference", "consistency",
          "special-values", "permutation", "honesty", "layouts", "window-causal")


def page_data(path):
    """The ```json block after a finding page's title line."""
    lines = open(path, encoding="utf-8").read().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip() == "```json")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].strip() == "```")
    return json.loads("\n".join(lines[start + 1:end]))


def kernel_words(repro):
    """The words of the --kernel spec of an `attest repro` line, after `exec:`."""
    words = shlex.split(repro)
    spec = words[words.index("--kernel") + 1]
    if not spec.startswith("exec:"):
        return None, words
    return shlex.split(spec[5:]), words


def backend_of(kw):
    """torch_worker.py's --backend; for another exec: worker, its file's name."""
    if not kw:
        return None
    if "--backend" in kw:
        return kw[kw.index("--backend") + 1]
    return next((os.path.basename(w) for w in kw if w.endswith(".py")), None)


def selected(backend, filters):
    return any(backend == f or backend.startswith(f + "-") for f in filters)


def check_for(page, words, case):
    if "--check" in words:
        return words[words.index("--check") + 1]
    name = os.path.basename(case)
    if any(f"-{c}-" in name or name.startswith(c + "-") for c in CHECKS):
        return None  # attest reads it from the name
    return "gqa-mha" if page["check"].startswith("gqa-mha") else "accuracy"


def jobs_of(args):
    out = []
    for name in sorted(os.listdir(args.findings)):
        if not name.endswith(".md") or name == "README.md":
            continue
        page = page_data(os.path.join(args.findings, name))
        kw, words = kernel_words(page["repro"])
        backend = backend_of(kw)
        if backend is None or not selected(backend, args.backends):
            continue
        # The worker as the page runs it, on --device, with torch_campaign.sh's environment.
        worker = [w for w in kw if w not in ("python3", "python")]
        if "--device" in worker:
            del worker[worker.index("--device"):worker.index("--device") + 2]
        spec = f"exec:{args.worker_env}{shlex.quote(args.worker_python)} " + \
            " ".join(shlex.quote(w) for w in worker)
        if any(w.endswith("torch_worker.py") for w in worker):
            spec += f" --device {args.device}"
        for case in page["case_files"]:
            stem = os.path.basename(case).replace(".case.json", "")
            out.append({"finding": page["id"], "case": case, "backend": backend,
                        "check": check_for(page, words, case), "kernel": spec,
                        "dir": os.path.join(args.out, "export", f"{page['id']}-{stem}")})
    return out


def kill_tree(pid):
    """SIGKILL to pid's process group and to the group of every descendant: attest starts an
    exec: worker in a process group of its own (kernels/exec/process.cc), which killing
    attest's group would leave running."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    todo, found = [pid], []
    while todo:
        q = todo.pop()
        found.append(q)
        todo += children.get(q, [])
    groups = set()
    for q in found:
        try:
            groups.add(os.getpgid(q))
        except OSError:
            pass
    groups.discard(os.getpgrp())
    for g in groups | {pid}:
        try:
            os.killpg(g, signal.SIGKILL)
        except OSError:
            pass


def run(cmd, timeout, cwd, log, env=None):
    """(exit status, seconds, output tail): the command in its own process group, its output
    into the file `log` (no pipe a stray grandchild could hold open), the group killed whole
    at the timeout (exit status "timeout")."""
    t0 = time.time()
    if timeout <= 0:
        return "not run (budget)", 0.0, ""
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(p.pid)
            p.wait()
            rc = "timeout"
    with open(log, errors="replace") as f:
        text = f.read()
    return rc, round(time.time() - t0, 1), text.strip()[-2000:]


def one(job, args, deadline):
    left = lambda: deadline - time.time()  # noqa: E731
    rec = dict(job)
    os.makedirs(os.path.dirname(job["dir"]), exist_ok=True)
    cmd = [args.attest, "repro", "--kernel", job["kernel"], "--case",
           os.path.join(ROOT, job["case"]), "--export", job["dir"]]
    if job["check"]:
        cmd += ["--check", job["check"]]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    rc, secs, tail = run(cmd, min(args.run_timeout, left() - 5), ROOT,
                         job["dir"] + ".attest.log")
    rec.update(attest_exit=rc, attest_seconds=secs)
    script = os.path.join(job["dir"], "repro.py")
    if os.path.isfile(script):
        rec["export"] = "repro.py"
    elif os.path.isfile(os.path.join(job["dir"], "REPORT.md")):
        why = re.search(r"No standalone script: (.*)", open(os.path.join(job["dir"],
                                                                        "REPORT.md")).read())
        rec["export"] = "attest only" + (f": {why.group(1)}" if why else "")
    else:
        lines = [ln for ln in tail.splitlines() if ln.startswith("attest repro:")]
        rec["export"] = "none" + (f": {lines[-1][14:]}" if lines else "")
    rec["repro_exit"], rec["repro_seconds"] = None, 0.0
    if os.path.isfile(script):
        env = {"PATH": "/usr/bin:/bin", "HOME": job["dir"]}
        if args.repro_pythonpath:
            env["PYTHONPATH"] = args.repro_pythonpath
        for k in ("LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "TORCHINDUCTOR_CACHE_DIR",
                  "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"):
            if k in os.environ:
                env[k] = os.environ[k]
        rc2, secs2, tail2 = run([args.repro_python, "repro.py"],
                                min(args.repro_timeout, left() - 2), job["dir"],
                                job["dir"] + ".repro.log", env=env)
        # The versions it ran on: repro.py prints them first (python, torch, CUDA, cuDNN, GPU).
        with open(job["dir"] + ".repro.log", errors="replace") as f:
            env_line = next((ln.strip() for ln in f if ln.startswith("python ")), "")
        rec.update(repro_exit=rc2, repro_seconds=secs2, repro_environment=env_line,
                   repro_verdict=next((ln for ln in reversed(tail2.splitlines())
                                       if ln.strip()), ""))
    rec["seconds"] = round(rec["attest_seconds"] + rec["repro_seconds"], 1)
    return rec


def table(records):
    rows = [("finding", "case", "attest", "export", "repro.py", "seconds")]
    for r in records:
        rows.append((r["finding"], os.path.basename(r["case"]).replace(".case.json", ""),
                     str(r["attest_exit"]), r["export"][:60],
                     "-" if r["repro_exit"] is None else str(r["repro_exit"]), str(r["seconds"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
                     for row in rows) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", required=True,
                    help="comma-separated backend names or prefixes (sdpa, fa4,flex, "
                    "sdpa-efficient+lse)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--attest", required=True, help="the attest executable")
    ap.add_argument("--out", required=True)
    ap.add_argument("--findings", default=os.path.join(ROOT, "docs", "findings"))
    ap.add_argument("--worker-python", default=sys.executable,
                    help="the Python of the exec: worker (torch_worker.py)")
    ap.add_argument("--worker-env", default="",
                    help="environment assignments put before the worker's command "
                    "('LD_LIBRARY_PATH=... PYTHONPATH=... ')")
    ap.add_argument("--repro-python", default=sys.executable,
                    help="the Python repro.py runs with (no attest on its path)")
    ap.add_argument("--repro-pythonpath", default="",
                    help="PYTHONPATH of repro.py: the kernel's own packages only")
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2, help="oracle threads per attest run")
    ap.add_argument("--run-timeout", type=float, default=240)
    ap.add_argument("--repro-timeout", type=float, default=180)
    ap.add_argument("--call-seconds", type=float, default=540,
                    help="every process ends by then (seconds from the start)")
    args = ap.parse_args(argv)
    args.backends = [b for b in args.backends.split(",") if b]
    for name in ("attest", "repro_python"):  # repro.py runs in its folder
        if os.sep in getattr(args, name):
            setattr(args, name, os.path.abspath(getattr(args, name)))
    deadline = time.time() + args.call_seconds
    jobs = jobs_of(args)
    os.makedirs(os.path.join(args.out, "export"), exist_ok=True)
    print(f"findings_export: {len(jobs)} case(s) for {','.join(args.backends)} on "
          f"{args.device}, {args.jobs} at a time, {args.call_seconds:.0f} s budget", flush=True)
    records = []
    with cf.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(one, j, args, deadline) for j in jobs]
        for f in futures:
            r = f.result()
            records.append(r)
            print(f"  {r['finding']} {os.path.basename(r['case'])}: attest {r['attest_exit']}, "
                  f"{r['export'][:70]}, repro.py {r['repro_exit']}", flush=True)
    with open(os.path.join(args.out, "findings-export.json"), "w") as f:
        json.dump({"device": args.device, "backends": args.backends, "cases": records}, f,
                  indent=1, sort_keys=True)
    text = table(records)
    with open(os.path.join(args.out, "findings-export.txt"), "w") as f:
        f.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
