"""Host-side block-table validation (one device-to-host copy; call it when you can afford a sync)."""

from __future__ import annotations

import torch


def pages_needed(num_tokens: int, page_size: int) -> int:
    """Pages a sequence of ``num_tokens`` tokens occupies: ``ceil(num_tokens / page_size)``."""
    return -(-int(num_tokens) // int(page_size))


def validate_block_table(
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    num_blocks: int,
    *,
    name: str = "block_table",
) -> None:
    """Check a block table against the tokens each sequence will read from the cache.

    ``block_table``: int32/int64 ``[batch_rows, max_pages]`` (extra rows are ignored).
    ``seq_lens``: integer ``[batch]``: how many cached tokens sequence ``b`` needs (its pages are
    ``block_table[b, :ceil(seq_lens[b] / page_size)]``). Entries past a sequence's need are
    ignored, whatever they hold. Raises ``ValueError`` naming the first bad sequence and entry.
    """
    if not isinstance(block_table, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(block_table).__name__}")
    if block_table.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {block_table.dtype}")
    if block_table.dim() != 2:
        raise ValueError(f"{name} must be 2-D [batch, max_pages], got shape {tuple(block_table.shape)}")
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    lens = seq_lens.detach().to("cpu", torch.int64).reshape(-1)
    batch = lens.numel()
    if block_table.shape[0] < batch:
        raise ValueError(f"{name} has {block_table.shape[0]} rows but there are {batch} sequences")
    if batch and int(lens.min()) < 0:
        b = int(torch.nonzero(lens < 0)[0])
        raise ValueError(f"sequence {b} has a negative length {int(lens[b])}")
    need = (lens + page_size - 1) // page_size  # [batch]
    width = block_table.shape[1]
    if batch and int(need.max()) > width:
        b = int(torch.nonzero(need > width)[0])
        raise ValueError(
            f"{name} is too narrow: sequence {b} has {int(lens[b])} tokens = {int(need[b])} pages of "
            f"{page_size}, but the table has {width} columns"
        )
    table = block_table[:batch].detach().to("cpu", torch.int64)
    used = torch.arange(width)[None, :] < need[:, None]  # [batch, width]
    bad = used & ((table < 0) | (table >= num_blocks))
    if bool(bad.any()):
        b, j = (int(i) for i in torch.nonzero(bad)[0])
        raise ValueError(
            f"{name}[{b}, {j}] = {int(table[b, j])} is outside [0, {num_blocks}) "
            f"(sequence {b} needs pages 0..{int(need[b]) - 1})"
        )
