"""The CPU example's gate (docs/byok.md): the kernel passes it with its shape limits declared
and complete coverage (no allow_skips), and a seeded bug, the causal mask skipped on diagonal
tiles, fails it. ctest python_examples runs this file (python/CMakeLists.txt)."""
import importlib.util

import pytest

pytest.importorskip("torch")
import attest  # noqa: E402
import tiled_attention_cpu as kernel  # noqa: E402


def gate(fn, failure_dir):
    return attest.check(fn, api="attest", caps=kernel.CAPS, suite="gate", dtype="bf16",
                        device="cpu", failure_dir=failure_dir)


def test_gate_passes(tmp_path):
    report = gate(kernel.attention, tmp_path)
    assert report.passed, report.summary()


def test_diagonal_tile_unmasked_fails(tmp_path):
    # A fresh copy of the module with the diagonal tile's mask left out of forward and backward.
    spec = importlib.util.find_spec(kernel.__name__)
    bug = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bug)
    bug.mask_diagonal_tile = lambda s: s
    report = gate(bug.attention, tmp_path)
    assert {"accuracy", "non-interference"} <= {v.check for v in report.failures}, \
        report.summary()
