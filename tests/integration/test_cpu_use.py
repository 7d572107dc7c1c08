"""Both kernel packages on CPU tensors: without the Triton interpreter a call is a ``ValueError`` saying
how to run it (not Triton's pointer error from inside the launch); under the interpreter bf16, whose
``tl.dot`` the interpreter cannot multiply, is computed in fp32 and matches the reference."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import ON_GPU, poison

from attn_reference import attention_varlen, compare, paged_prefix_attention

_CHILD = r"""
import torch
import prefix_prefill, window_prefill

q = torch.randn(4, 2, 16)
k, v = torch.randn(4, 1, 16), torch.randn(4, 1, 16)
cu = torch.tensor([0, 4], dtype=torch.int32)
cache = torch.randn(2, 16, 1, 16)
bt = torch.tensor([[0, 1]], dtype=torch.int32)
calls = {
    "window_prefill": lambda: window_prefill.window_prefill(q, k, v, cu, 4),
    "prefix_prefill": lambda: prefix_prefill.prefix_prefill(
        q, k, v, cache, cache, bt, cu, torch.tensor([10], dtype=torch.int32), 4, kv_layout="nhd"),
}
for name, call in calls.items():
    try:
        call()
    except ValueError as e:
        print(name, "ValueError:", e)
    else:
        print(name, "ran")
"""


def test_cpu_tensors_without_the_interpreter_are_a_clear_error():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2, out.stdout
    for line in lines:
        assert "ValueError: q is a CPU tensor" in line and "TRITON_INTERPRET=1" in line, line


@pytest.mark.skipif(ON_GPU, reason="the interpreter's bf16 path; GPUs run bf16 in the GPU suites")
def test_bf16_under_the_interpreter_matches_the_reference():
    import prefix_prefill
    import window_prefill

    gen = torch.Generator().manual_seed(7)
    q = torch.randn(20, 4, 32, generator=gen).bfloat16()
    k = torch.randn(20, 2, 32, generator=gen).bfloat16()
    v = torch.randn(20, 2, 32, generator=gen).bfloat16()
    cu = torch.tensor([0, 7, 20], dtype=torch.int32)
    out = poison(torch.empty_like(q))
    window_prefill.window_prefill(q, k, v, cu, 13, causal=True, window=(5, -1), out=out)
    res = compare(out, attention_varlen(q, k, v, cu, cu, causal=True, window=(5, -1)))
    assert res, res

    cache_k = torch.randn(6, 16, 2, 32, generator=gen).bfloat16()
    cache_v = torch.randn(6, 16, 2, 32, generator=gen).bfloat16()
    bt = torch.tensor([[4, 1, 0], [2, 5, 3]], dtype=torch.int32)
    seq_lens = torch.tensor([7 + 18, 13 + 30], dtype=torch.int32)
    out = poison(torch.empty_like(q))
    prefix_prefill.prefix_prefill(q, k, v, cache_k, cache_v, bt, cu, seq_lens, 13, kv_layout="nhd", out=out)
    want = paged_prefix_attention(q, k, v, cache_k, cache_v, bt, cu, seq_lens, layout="nhd")
    res = compare(out, want)
    assert res, res
