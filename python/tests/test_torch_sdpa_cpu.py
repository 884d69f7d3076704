"""PyTorch's own SDPA on the CPU through attest (docs/python.md "Measured"): the gate passes
in f32; in bf16 its flash backward rounds dk and dv to bf16 after every query block and every
query head of a GQA group, which the gqa-mha relation reports (a finding, not a false alarm)."""
import os

import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
FINDING = os.path.join(ROOT, "golden", "findings",
                       "sdpa-cpu-flash-bf16-gqa-dv-accumulated-in-bf16.case.json")


def test_sdpa_f32_passes_the_gate():
    report = attest.check(F.scaled_dot_product_attention, api="sdpa", dtype="f32",
                          device="cpu", suite="gate")
    assert report.passed, report.summary()


def test_sdpa_bf16_gqa_backward_finding_reproduces():
    code = attest.repro(F.scaled_dot_product_attention, case=FINDING, check="gqa-mha",
                        api="sdpa", dtype="bf16", device="cpu")
    assert code == 1


def math_sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                              scale=scale, enable_gqa=enable_gqa)


def test_sdpa_math_bf16_passes_the_finding_case():  # fp32 inside: nothing rounded per block
    code = attest.repro(math_sdpa, case=FINDING, check="gqa-mha", api="sdpa", dtype="bf16",
                        device="cpu")
    assert code == 0
