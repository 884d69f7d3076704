"""What an installed wheel must do, run by the venv's Python that the wheel went into
(tools/python_wheel.sh, on the build machine and in a chroot of another distribution):

  1. `import attest` comes from site-packages; the quick suite passes on cpu/flash2-bf16 and a
     mutant fails it, with a repro line;
  2. every library the extension links is loaded from the wheel (attest.libs/), none from the
     system (/proc/self/maps);
  3. the pytest plugin is loaded by its entry point (pytest11, pyproject.toml) with no `-p`,
     collects one item per suite row, passes on the kernel and fails on the mutant;
  4. the `attest` command on the venv's PATH is the command line: with --cli REF (the CMake
     build's tools/attest/attest), every command of COMMANDS below gives the same exit code,
     stdout, stderr and written files through both (wall times aside: WALL_TIMES), each run
     as `attest` from PATH in a folder of its own;
  5. the CUDA oracle (--cuda-oracle yes: the wheel was built with it): libattest_oracle_cuda.so
     is in the package, the package points the loader at it (ATTEST_ORACLE_CUDA, set on
     import) and the loader loads that file; with or without it, a kernel on CUDA (NumPy's
     exec worker declaring "device": "cuda", --workers) is judged with the CPU oracle on a
     machine without a GPU, the report saying `oracle_device: cpu` and the warning why, and
     `--oracle-device cuda` is refused with the reason (exit 2) through the API and through
     the `attest` command, which finds the same library.

Usage: VENV/bin/python3 wheel_proof.py [--cli REF] [--work DIR] [--cuda-oracle yes|no]
                                       [--workers DIR]
Prints one line per step; exits 1 on the first difference."""

import argparse
import filecmp
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import warnings

# The command line's subcommands, each run the same way through both binaries (in a folder of
# its own, so that relative paths in their outputs are equal). {case} is a failing case the
# mutant's check saved. convert, quantize, audit and golden are covered by their --help.
COMMANDS = [
    ["--help"], ["--version"], ["nosuch"],
    ["list", "kernels"], ["list", "checks"], ["list", "suites"], ["list", "recipes"],
    ["list", "profiles"], ["list", "formats"], ["list", "schemes"],
    ["check", "--suite", "quick", "--kernel", "cpu/flash2-bf16", "--json", "report.json",
     "--junit", "report.xml", "--markdown", "report.md"],
    ["check", "--suite", "quick", "--kernel", "mutant/causal-top-left", "--json",
     "report.json", "--out", "fails"],
    ["repro", "--kernel", "mutant/causal-top-left", "--case", "{case}"],
    ["oracle", "--case", "{case}", "--out", "o.safetensors", "--quiet"],
    ["fuzz", "--kernel", "mutant/causal-top-left", "--seed", "1", "--cases", "4", "--out",
     "fz", "--quiet"],
] + [[sub, "--help"] for sub in ("check", "fuzz", "repro", "audit", "compare", "convert",
                                 "oracle", "quantize", "golden", "inspect")]

PLUGIN_TEST = '''import attest
test_flash2 = attest.pytest_suite("cpu/flash2-bf16", suite="quick")
test_mutant = attest.pytest_suite("mutant/causal-top-left", suite="quick")
'''


def step(msg):
    print(f"wheel_proof: {msg}", flush=True)


def fail(msg):
    print(f"wheel_proof: FAILED: {msg}", flush=True)
    sys.exit(1)


def api_and_libraries():
    import attest
    site = sysconfig.get_paths()["platlib"]
    if not attest.__file__.startswith(site):
        fail(f"attest imported from {attest.__file__}, not {site}")
    core = attest._core.__file__
    report = attest.check("cpu/flash2-bf16", suite="quick")
    if not (report.passed and len(report.verdicts) > 50):
        fail(report.summary())
    bug = attest.check("mutant/causal-top-left", suite="quick")
    if bug.passed or not bug.failures[0].repro:
        fail("the mutant passes the quick suite")
    maps = open("/proc/self/maps").read().split("\n")
    libs = {line.split()[-1] for line in maps if ".so" in line and "/" in line}
    ours = sorted(os.path.basename(lib) for lib in libs if "attest.libs" in lib)
    system = [lib for lib in libs if lib.startswith(("/usr/", "/lib")) and any(
        n in os.path.basename(lib) for n in ("openblas", "blas", "mpfr", "gmp", "fmt"))]
    if not ours or system:
        fail(f"libraries from the wheel: {ours}; from the system: {system}")
    step(f"Python {sys.version.split()[0]}, module {os.path.basename(core)}: quick suite "
         f"{len(report.verdicts)} verdicts pass, the mutant fails ({bug.failures[0].check}); "
         f"libraries from the wheel: {', '.join(ours)}")


def plugin(work):
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "test_wheel_plugin.py"), "w") as f:
        f.write(PLUGIN_TEST)
    junit = os.path.join(work, "plugin.xml")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "test_wheel_plugin.py", "--junitxml", junit],
                       cwd=work, capture_output=True, text=True)
    tail = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-500:]
    import xml.etree.ElementTree as ET
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    # JUnit names an item test_wheel_plugin.test_mutant (classname) and check[case] (name).
    names = [c.get("classname").split(".")[-1] + "::" + c.get("name") for c in cases]
    failed = {n for n, c in zip(names, cases)
              if c.find("failure") is not None or c.find("error") is not None}
    # The exit code is 1 (the mutant's items fail); every failing item is the mutant's.
    flash2 = [n for n in names if n.startswith("test_flash2::")]
    bad = [n for n in failed if not n.startswith("test_mutant::")]
    if r.returncode != 1 or len(flash2) < 10 or bad or not failed:
        fail(f"pytest rc {r.returncode}, {len(names)} items, failing {sorted(failed)[:5]}: "
             f"{tail}\n{r.stdout[-2000:]}")
    step(f"pytest plugin (entry point): {len(names)} items, {len(flash2)} of cpu/flash2-bf16 "
         f"and none of them failing, {len(failed)} of the mutant failing ({tail})")


def cuda_oracle(expected, workers, work):
    import attest
    lib = os.path.join(os.path.dirname(attest.__file__), "libattest_oracle_cuda.so")
    env = os.environ.get("ATTEST_ORACLE_CUDA")
    found = attest._core.cuda_oracle()
    if expected:
        if not os.path.isfile(lib) or env != lib or found["library"] != lib:
            fail(f"CUDA oracle: {lib} present {os.path.isfile(lib)}, ATTEST_ORACLE_CUDA "
                 f"{env!r}, the loader loads {found['library']!r} ({found['why']})")
    elif os.path.exists(lib) or env is not None or found["library"]:
        fail(f"a CPU-only wheel with a CUDA oracle: {lib} present {os.path.exists(lib)}, "
             f"ATTEST_ORACLE_CUDA {env!r}, the loader loads {found['library']!r}")
    if found["devices"] > 0:
        step(f"CUDA oracle: {found['library']}, {found['devices']} GPU(s); the CPU-oracle "
             "steps are for a machine without one")
        return
    # The reason the loader gives: with the wheel's library, its own words (the CUDA runtime's
    # error without a driver or GPU); without it, that no library loads.
    why = found["why"]
    if expected != ("cudaGetDeviceCount" in why):
        fail(f"CUDA oracle: the reason for no GPU is not the {'wheel' if expected else ''} "
             f"library's: {why}")
    bad = None
    try:
        attest.check("cpu/flash2-bf16", suite="quick", oracle_device="cuda")
    except ValueError as e:
        bad = str(e)
    if not bad or why.split(":")[0] not in bad:
        fail(f"oracle_device='cuda' without a GPU: {bad!r}")
    r = run_cli(os.path.dirname(sys.executable), ["check", "--kernel", "cpu/flash2-bf16",
                                                   "--suite", "quick", "--oracle-device",
                                                   "cuda"], work)
    if r.returncode != 2 or why.split(":")[0].encode() not in r.stderr:
        fail(f"`attest check --oracle-device cuda` from PATH: exit {r.returncode}, "
             f"{r.stderr[-500:]!r}")
    worker = os.path.join(workers or "", "numpy_worker.py")
    if not workers or not os.path.isfile(worker):
        step(f"CUDA oracle: {found['library'] or 'none'} ({why}); no NumPy worker to judge "
             "a kernel on CUDA with (--workers)")
        return
    spec = f"exec:{sys.executable} {worker} --declare-device cuda"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = attest.check(spec, suite="quick", only_check="accuracy")
    notes = [str(w.message) for w in caught if "float64 oracle runs on the CPU" in str(
        w.message)]
    if report.data.get("oracle_device") != "cpu" or not notes or not report.passed:
        fail(f"a kernel on CUDA without a GPU: oracle_device "
             f"{report.data.get('oracle_device')!r}, warnings {notes}, {report.summary()}")
    step(f"CUDA oracle: {'the wheel' if expected else 'none in the wheel'}"
         f"{' (' + found['library'] + ')' if expected else ''}; no GPU here ({why}): a kernel "
         f"on CUDA ({len(report.verdicts)} verdicts) is judged with oracle_device cpu and the "
         "warning says why; --oracle-device cuda exits 2 with that reason from the API and "
         "from `attest` on PATH")


# Wall times, which differ between any two runs (the same binary's too): "(3.0 s)" in the
# console report and the progress lines, "in 0.2 s (26.4 cases/s)" in fuzz's, time="..." in
# JUnit, "seconds" in fuzz-report.json. Replaced before comparing; the check reports' JSON
# holds none (no --timings).
WALL_TIMES = [(re.compile(rb"\b\d+(\.\d+)? (s|cases/s)\b"), b"# s"),
              (re.compile(rb'\btime="[0-9.e+-]+"'), b'time="#"'),
              (re.compile(rb'\btimestamp="[^"]*"'), b'timestamp="#"'),
              (re.compile(rb'"seconds": [0-9.e+-]+'), b'"seconds": #')]


def timeless(data):
    for pattern, repl in WALL_TIMES:
        data = pattern.sub(repl, data)
    return data


def run_cli(exe_dir, args, cwd):
    env = dict(os.environ, PATH=exe_dir + os.pathsep + os.environ.get("PATH", ""))
    env.pop("PYTHONPATH", None)
    # Set by `import attest` in this process (the proof runs without it): the wheel's
    # `attest` must find its CUDA oracle by itself.
    env.pop("ATTEST_ORACLE_CUDA", None)
    return subprocess.run(["attest"] + args, cwd=cwd, env=env, capture_output=True)


def same_tree(a, b):
    """The files two runs wrote: the same names and bytes (None) or the first difference."""
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only:
        return f"files only in one: {cmp.left_only} {cmp.right_only}"
    for name in cmp.common_files:
        fa, fb = (open(os.path.join(d, name), "rb").read() for d in (a, b))
        if timeless(fa) != timeless(fb):
            return f"{os.path.join(a, name)} and {os.path.join(b, name)} differ"
    for d in cmp.common_dirs:
        why = same_tree(os.path.join(a, d), os.path.join(b, d))
        if why:
            return why
    return None


def cli_equality(ref, work):
    wheel_dir = os.path.dirname(sys.executable)  # the venv's bin/, where pip put `attest`
    ref_dir = os.path.join(work, "ref-bin")
    os.makedirs(ref_dir, exist_ok=True)
    link = os.path.join(ref_dir, "attest")
    if not os.path.lexists(link):
        os.symlink(os.path.abspath(ref), link)
    # The one build-dependent output: the commit each build was configured at (--version,
    # the reports' attest.commit). A CMake build older than the wheel's commit is stale.
    versions = [run_cli(d, ["--version"], work).stdout for d in (wheel_dir, ref_dir)]
    if versions[0] != versions[1]:
        fail(f"the wheel is {versions[0]!r}, {ref} is {versions[1]!r}: build both from the "
             "same commit (cmake --build after the last commit)")
    case = None
    case_from = {}  # side: the folder of the mutant's check, where it saved its cases
    codes = []
    for i, args in enumerate(COMMANDS):
        if "{case}" in args:
            args = [a.replace("{case}", case) for a in args]
        outs = []
        for side, exe_dir in (("wheel", wheel_dir), ("ref", ref_dir)):
            cwd = os.path.join(work, f"cli{i:02d}", side)
            if case:  # the mutant's failing case, copied to the same relative path
                os.makedirs(os.path.join(cwd, "fails"), exist_ok=True)
                shutil.copy(os.path.join(case_from[side], case), os.path.join(cwd, case))
            os.makedirs(cwd, exist_ok=True)
            outs.append((run_cli(exe_dir, args, cwd), cwd))
        (w, wcwd), (r, rcwd) = outs
        what = " ".join(["attest"] + args)
        for name in ("returncode", "stdout", "stderr"):
            wv, rv = getattr(w, name), getattr(r, name)
            if name != "returncode":
                wv, rv = timeless(wv), timeless(rv)
            if wv != rv:
                fail(f"`{what}`: {name} differs:\nwheel: {wv!r:.3000}\nref:   {rv!r:.3000}")
        why = same_tree(wcwd, rcwd)
        if why:
            fail(f"`{what}`: {why}")
        codes.append(w.returncode)
        if args[:1] == ["check"] and "mutant/causal-top-left" in args:
            saved = sorted(f for f in os.listdir(os.path.join(wcwd, "fails"))
                           if f.endswith(".case.json"))
            if w.returncode != 1 or not saved:
                fail(f"`{what}`: exit {w.returncode}, saved {saved}")
            case = os.path.join("fails", saved[0])
            case_from = {"wheel": wcwd, "ref": rcwd}
    step(f"CLI: {len(COMMANDS)} commands give the same exit codes, stdout, stderr and files "
         f"through the wheel's `attest` and {ref} (exit codes "
         f"{' '.join(str(c) for c in codes)})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", help="the CMake build's attest executable to compare with")
    ap.add_argument("--work", help="a folder for the runs' files (default: a temporary one)")
    ap.add_argument("--cuda-oracle", choices=["yes", "no"], default="no",
                    help="whether the wheel was built with the CUDA oracle")
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--workers", default=os.path.join(here, "..", "..", "tools", "workers"),
                    help="the folder of numpy_worker.py and attest_worker.py")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="attest-wheel-proof-")
    os.makedirs(work, exist_ok=True)
    os.chdir(work)  # not the source tree: `import attest` must find the installed package
    api_and_libraries()
    plugin(os.path.join(work, "plugin"))
    cuda_oracle(a.cuda_oracle == "yes", os.path.abspath(a.workers), work)
    r = run_cli(os.path.dirname(sys.executable), ["list", "kernels"], work)
    if r.returncode != 0 or b"cpu/flash2-bf16" not in r.stdout:
        fail(f"`attest list kernels` from the venv's PATH: exit {r.returncode}")
    if a.cli:
        cli_equality(a.cli, os.path.join(work, "cli"))
    step("ok")


if __name__ == "__main__":
    main()
