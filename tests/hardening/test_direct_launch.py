"""Repeat calls launch the compiled kernel directly (``prefill_runtime.compiled_launch``), keyed by what
each package computes per call. With ``CompiledLaunches.verify`` every direct launch first asks Triton
which variant it would pick for those very arguments and fails where the key's kernel is another: the
key must capture every specialisation (strides, alignment, dtypes, descriptors). Calls of one signature
with new lengths, batches, pointers (misaligned views) and token counts follow each other, and every
answer is compared with the reference (GPU only: the interpreter never launches directly)."""

from __future__ import annotations

import pytest
import torch
from conftest import ON_GPU
from hd_util import dense_case, dense_ref, paged_case, paged_ref, run_pcaf, run_pp, run_wcaf, run_wp

from attn_reference import compare
from prefill_runtime.compiled_launch import CompiledLaunches

pytestmark = pytest.mark.skipif(not ON_GPU, reason="direct launches run on NVIDIA GPUs only")


@pytest.fixture(autouse=True)
def _verify(monkeypatch):
    monkeypatch.setattr(CompiledLaunches, "verify", True)


def _shifted(t: torch.Tensor, elems: int) -> torch.Tensor:
    """``t``'s values at ``elems`` elements into a new buffer (another pointer; 16-byte aligned or not)."""
    buf = torch.empty(t.numel() + elems, dtype=t.dtype, device=t.device)
    out = buf[elems:].view(t.shape)
    out.copy_(t)
    return out


@pytest.mark.parametrize("head", [64, 128])
@pytest.mark.parametrize("window", [(-1, -1), (255, -1), (4095, -1)])
def test_window_repeat_calls(head, window):
    """window_prefill and its vLLM form over lengths, batches and shifted q (16-byte aligned or not);
    (4095, -1) on 2300-token sequences runs the Gluon kernel on sm90 for 16-bit heads."""
    for lens in ([100], [300, 2300], [7, 1, 2300], [2300, 40, 5, 1]):
        c = dense_case(lens, 8, 2, head, torch.bfloat16)
        for shift in (0, 0, 1, 8):
            if shift:
                c.q = _shifted(c.q, shift)
            want = dense_ref(c, window=window)
            got = run_wp(c, window=window)
            assert compare(got, want), (lens, shift)
            if window[0] != 4095:
                assert compare(run_wcaf(c, window=window), want), (lens, shift)


@pytest.mark.parametrize(("layout", "head", "page"), [("split", 128, 16), ("nhd", 128, 544), ("hnd", 64, 16),
                                                      ("split", 256, 16), ("nhd", 64, 16)])  # fmt: skip
def test_prefix_repeat_calls(layout, head, page):
    """prefix_prefill (and vLLM's form on the split layout) over contexts, batches and token counts,
    k given and read from the cache: the Gluon kernels (sm90, 16-bit) and the Triton one (HND)."""
    for seqs in ([(30, 20)], [(600, 100), (0, 33)], [(17, 1), (1000, 300), (5, 5)]):
        for from_cache in (False, True):
            c = paged_case(seqs, heads=8, kv_heads=2, head=head, page=page, dtype=torch.bfloat16,
                           layout=layout, kv_from_cache=from_cache)  # fmt: skip
            want = paged_ref(c)
            for _ in range(2):
                assert compare(run_pp(c), want), (seqs, from_cache)
                if layout == "split":
                    assert compare(run_pcaf(c), want), (seqs, from_cache)
