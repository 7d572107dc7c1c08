"""The status a kernel reports when it meets malformed device metadata, host side: the bit meanings,
their names and the check of a caller's ``status=`` tensor.

Every kernel of the prefill packages bounds each of its loads and stores by extents the host knows
(tensor sizes, the cache's ``num_blocks``, the block table's width, the token count), whatever the
device metadata (``cu_seqlens``, sequence lengths, block tables, the max lengths) says; a row it cannot
compute is written as 0. A caller that passes ``status=`` (an int32 device tensor of one element)
gets the OR of these bits there when a launch met malformed metadata, written by the kernel itself
(no host sync): an engine reads it when it likes, and clears it (``status.zero_()``) to start over.
The kernels never clear it.

=================  =====  ===================================================================
name               bit    a sequence ...
=================  =====  ===================================================================
``BLOCK_ID``       1      ... needs a block-table entry outside ``[0, num_blocks)`` (the kernel
                          reads a block inside the cache instead)
``TABLE_WIDTH``    2      ... needs more pages than the block table has columns (keys past the
                          table's width are left out)
``ROWS``           4      ... has query/token rows outside ``[0, total tokens)`` or a negative
                          length (``cu_seqlens`` decreasing or past the tensors, a negative start
                          or length): its rows are clamped into the tensors
``MAX_LEN``        8      ... is longer than the ``max_query_len`` / ``max_seqlen`` /
                          ``max_input_len`` given (the grid is sized by it: rows past the grid
                          are written as 0)
``SEQ_LEN``        16     ... has a total length (``seq_lens``) shorter than its query length (it is
                          then computed with no cached context)
=================  =====  ===================================================================

``BLOCK_ID`` and ``TABLE_WIDTH`` concern the pages a sequence reads from a paged cache (prefix-prefill
only); a kernel reports each sequence's malformations once (from one of its programs).
"""

from __future__ import annotations

import torch

BLOCK_ID = 1
TABLE_WIDTH = 2
ROWS = 4
MAX_LEN = 8
SEQ_LEN = 16

#: every bit, by name (the table above)
CODES = {
    "BLOCK_ID": BLOCK_ID,
    "TABLE_WIDTH": TABLE_WIDTH,
    "ROWS": ROWS,
    "MAX_LEN": MAX_LEN,
    "SEQ_LEN": SEQ_LEN,
}


def status_names(code: int) -> list[str]:
    """The names of the bits set in a status value (``int(status)``), in bit order."""
    return [name for name, bit in CODES.items() if int(code) & bit]


def new_status(device: torch.device | str) -> torch.Tensor:
    """A cleared status tensor: int32 ``[1]`` zeros on ``device``."""
    return torch.zeros(1, dtype=torch.int32, device=device)


def check_status(status: object, device: torch.device) -> torch.Tensor | None:
    """A ``status=`` argument checked on the host (no device read): None, or an int32 tensor of one
    element on ``device``; raises ``TypeError``/``ValueError`` naming it otherwise."""
    if status is None:
        return None
    if not isinstance(status, torch.Tensor):
        raise TypeError(f"status must be an int32 torch.Tensor of one element, got {type(status).__name__}")
    if status.dtype != torch.int32:
        raise TypeError(f"status must be int32 (one element), got {status.dtype}")
    if status.numel() != 1:
        raise ValueError(f"status must hold one element (int32 [1]), got shape {tuple(status.shape)}")
    if status.device != device:
        raise ValueError(f"status is on {status.device} but q is on {device}")
    return status
