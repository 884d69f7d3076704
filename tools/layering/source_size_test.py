#!/usr/bin/env python3
"""ctest source_size_test: no file of code over 800 lines, no function over 150.

A newcomer reads a file in one sitting and a function on two screens; the limits keep it so
(docs/design.md "Layers"). Files: every tracked C, C++, CUDA, HIP, Python, shell and CMake
file. Functions: C, C++, CUDA and HIP (.cu and .cuh parsed as C++) and Python, measured by
lizard (https://github.com/terryyin/lizard, PyPI `lizard`): a function's length runs from
its first line to its last, comments and blank lines included.

Usage: source_size_test.py ROOT   (exit 0: within the limits; 1: a file or function over, each
named with its length; 2: usage; 77: lizard is not installed)
"""
import os
import subprocess
import sys

MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 150
CODE = (".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh", ".hip", ".py", ".sh", ".cmake")
FUNCTIONS = {".c": "cpp", ".cc": "cpp", ".cpp": "cpp", ".h": "cpp", ".hpp": "cpp",
             ".cu": "cpp", ".cuh": "cpp", ".hip": "cpp", ".py": "python"}


def tracked_files(root):
    """The files git tracks under ROOT, or, outside a git checkout, every file but build/."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True,
                             capture_output=True).stdout.decode()
        return [f for f in out.split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        found = []
        for top, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d not in ("build", ".git")]
            found += [os.path.relpath(os.path.join(top, f), root) for f in files]
        return found


def is_code(path):
    name = os.path.basename(path)
    return name == "CMakeLists.txt" or path.endswith(CODE) or path in ("tools/bootstrap",)


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print(__doc__.strip().splitlines()[-3], file=sys.stderr)
        return 2
    root = sys.argv[1]
    try:
        import lizard
    except ImportError:
        print("source_size_test: skipped, no lizard (tools/bootstrap installs it in build/venv)")
        return 77
    problems = []
    files = sorted(f for f in tracked_files(root) if is_code(f))
    functions = 0
    for rel in files:
        path = os.path.join(root, rel)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        if lines > MAX_FILE_LINES:
            problems.append(f"{rel}: {lines} lines (at most {MAX_FILE_LINES})")
        ext = os.path.splitext(rel)[1]
        if ext not in FUNCTIONS:
            continue
        # lizard picks the language from the file name; CUDA and HIP read as C++.
        name = rel if FUNCTIONS[ext] == "python" else os.path.splitext(rel)[0] + ".cc"
        for fn in lizard.analyze_file.analyze_source_code(name, text).function_list:
            functions += 1
            length = fn.end_line - fn.start_line + 1
            if length > MAX_FUNCTION_LINES:
                problems.append(f"{rel}:{fn.start_line}: {fn.name} is {length} lines "
                                f"(at most {MAX_FUNCTION_LINES})")
    for p in problems:
        print(p)
    print(f"source_size_test: {len(files)} files, {functions} functions, "
          f"{len(problems)} over the limits")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
