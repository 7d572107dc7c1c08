"""The fp8 scores' operands (:mod:`prefix_prefill.fp8_score_operands`, one Triton launch; the Gluon kernel's
``QK_FP8`` forms): q's two e4m3 parts and their scale per tile of ``block_m`` rows of a sequence and head,
the new tokens' v as float16, against their torch model (``pp_cases.fp8_operands_model``) on the device the
suite runs on (the Triton interpreter on the CPU): ragged sequences with an empty one, an outlier that sets
its tile's scale, a strided v, rows past ``max_query_len`` left alone; the parts hold a bfloat16 q exactly
down to its tile's e4m3 subnormal step and any q within ``2**-8`` (plus that step); a tile size other than
the kernel's is caught (negative control)."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE
from pp_cases import fp8_operands_model

from prefix_prefill.fp8_score_operands import fp8_score_operands

E4M3 = torch.float8_e4m3fn


def _inputs(seed: int = 0, d: int = 64, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    tokens, heads, kv_heads = 300, 4, 2
    q = torch.randn(tokens, heads, d, generator=gen) * 3
    q[5, 1, 3] = 1000.0  # (its tile's scale: the other values there fall toward e4m3's subnormals)
    q[250, 2] *= 1e-4
    fused = torch.randn(tokens, 3 * kv_heads, d, generator=gen)  # (v: a strided view of a qkv-like buffer)
    v = fused[:, 2 * kv_heads :]
    cu = torch.tensor([0, 100, 100, 300], dtype=torch.int32)
    return q.to(dtype).to(DEVICE), v.to(torch.bfloat16).to(DEVICE), cu.to(DEVICE)


def _covered(cu: list[int], max_query_len: int) -> torch.Tensor:
    """The token rows the launch covers (each sequence's first ``max_query_len``)."""
    rows = [r for s in range(len(cu) - 1) for r in range(cu[s], min(cu[s + 1], cu[s] + max_query_len))]
    return torch.tensor(rows, dtype=torch.long)


@pytest.mark.parametrize("max_query_len", [200, 150])
def test_operands_match_model(max_query_len):
    """Every operand equals its torch model over the rows the launch covers (values: an e4m3 zero's sign
    may differ); v is a float16 copy."""
    q, v, cu = _inputs()
    q8, qs, v16 = fp8_score_operands(q, v, cu, max_query_len, 128)
    m8, ms, mv = fp8_operands_model(q.cpu(), v.cpu(), cu.cpu(), max_query_len, 128)
    rows = _covered(cu.tolist(), max_query_len)
    assert q8.shape == (300, 4, 2, 64) and q8.dtype == E4M3 and qs.shape == (4, 300)
    assert torch.equal(q8.cpu()[rows].float(), m8[rows].float())
    assert torch.equal(qs.cpu()[:, rows], ms[:, rows])
    assert v16.dtype == torch.float16 and v16.is_contiguous() and torch.equal(v16.cpu(), mv)
    assert fp8_score_operands(q, None, cu, max_query_len, 128)[2] is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_q_parts_within_bound(dtype):
    """``(hi + lo) * 2**e`` equals a bfloat16 q but below its tile's e4m3 subnormal step (``2**-10 *
    2**e``: off by at most that), and is within ``2**-8 |q|`` plus that step of a float16 one; each tile's
    largest ``|q| * 2**-e`` lies in (128, 256]."""
    q, _, cu = _inputs(1, d=128, dtype=dtype)
    q8, qs, _ = fp8_score_operands(q, None, cu, 200, 128)
    q8, qs, qf = q8.cpu().float(), qs.cpu(), q.cpu().float()
    back = (q8[:, :, 0] + q8[:, :, 1]) * qs.t()[:, :, None]
    step = qs.t()[:, :, None] * 2.0**-10
    rel = 0.0 if dtype == torch.bfloat16 else 2.0**-8
    assert ((back - qf).abs() <= qf.abs() * rel + step).all()
    if dtype == torch.bfloat16:  # (exact above the step's range)
        big = qf.abs() >= step * 2**8
        assert torch.equal(back[big], qf[big])
    for t0 in (0, 100, 228):  # (a tile's first row: sequence 0, sequence 2's two tiles)
        t1 = 100 if t0 == 0 else (228 if t0 == 100 else 300)
        top = (qf[t0:t1].abs() / qs.t()[t0:t1, :, None]).amax(dim=(0, 2))
        assert ((top > 128) & (top <= 256)).all(), top


def test_other_tile_size_caught():
    """Negative control: scales made by tiles of 64 rows differ from the kernel's 128-row tiles."""
    q, _, cu = _inputs()
    _, qs, _ = fp8_score_operands(q, None, cu, 200, 128)
    _, ms, _ = fp8_operands_model(q.cpu(), None, cu.cpu(), 200, 64)
    assert not torch.equal(qs.cpu(), ms)
