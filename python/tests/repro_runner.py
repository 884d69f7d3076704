"""Runs exported repro.py scripts for the export tests (python/tests/export_*_test.py)."""

import json
import subprocess
import sys


# The scripts run one after another in one clean interpreter (isolated mode, attest
# unimportable, a fresh environment), each from its folder as __main__, so that torch is
# imported once; python_export runs each in a process of its own.
BOOT = """
import json, os, runpy, sys
sys.modules["attest"] = None
codes = []
for folder, args in json.loads(sys.argv[1]):
    os.chdir(folder)
    sys.argv = ["repro.py"] + args
    print(f"==== {folder}", flush=True)
    try:
        runpy.run_path("repro.py", run_name="__main__")
        codes.append(0)
    except SystemExit as e:
        codes.append(e.code if isinstance(e.code, int) else 1)
    except BaseException as e:  # noqa: BLE001 - an uncaught error is the script's exit 1
        print(f"uncaught {type(e).__name__}: {e}")
        codes.append(1)
print("CODES " + json.dumps(codes))
"""


def run_scripts(runs):
    """[(folder, args)] -> ([exit status], [output]), in order."""
    r = subprocess.run([sys.executable, "-I", "-c", BOOT, json.dumps(runs)],
                       env={"PATH": "/usr/bin:/bin", "HOME": runs[0][0]}, capture_output=True,
                       text=True, timeout=900)
    out = r.stdout + r.stderr
    codes = json.loads(out.split("CODES ")[-1].splitlines()[0]) if "CODES " in out else []
    logs = [chunk.partition("\n")[2] for chunk in out.split("==== ")[1:]]
    return codes, logs + [""] * (len(runs) - len(logs))
