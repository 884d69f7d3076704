"""The pytest plugin on the quick suite (run by python/tests/run_tests.py, which compares
its items with the API's and the CLI's verdicts)."""

import attest
from kernels_for_tests import eager_sdpa

test_eager_sdpa = attest.pytest_suite(eager_sdpa, api="sdpa", suite="quick", dtype="bf16",
                                      device="cpu")
