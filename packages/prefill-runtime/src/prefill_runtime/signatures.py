"""Call signatures: what a kernel package's host-side checks and plan depend on, as a hashable key,
and the bounded table of the signatures seen before.

A public function's first call of a signature runs its full checks and plans; a later call of the same
signature checks only what the signature leaves open (token count, batch, lengths) and launches what
the first one prepared. A signature holds every tensor's strides, dtype, device and alignment, its
shape but for the dimensions that vary from call to call, and every option. The key parts here read as
few tensor attributes as they can: the host time of a warm call is mostly these reads.
"""

from __future__ import annotations

import torch


def rows_key(t: torch.Tensor | None) -> tuple | None:
    """A ``[tokens, ...]`` tensor's part of a call signature: everything but its token count (a CUDA
    device by its index, any other device whole; the alignment as the pointer's low four bits)."""
    if t is None:
        return None
    shape = t.shape  # (its middle dimensions only when there are more than one: a Size slice costs more)
    middle = shape[1:-1] if len(shape) != 3 else None
    dev = t.get_device()
    return (
        shape[1],
        shape[-1],
        middle,
        t.stride(),
        t.dtype,
        dev if dev >= 0 else t.device,
        t.data_ptr() & 15,
    )


def whole_key(t) -> tuple | None:
    """A tensor's part of a call signature, whole (caches, per-head tensors; a float scale as itself)."""
    if not isinstance(t, torch.Tensor):
        return t
    dev = t.get_device()
    return (t.shape, t.stride(), t.dtype, dev if dev >= 0 else t.device, t.data_ptr() & 15)


def table_key(bt: torch.Tensor) -> tuple:
    """A block table's part: its rank, column stride, dtype, device and alignment (rows and width vary)."""
    dev = bt.get_device()
    return (bt.dim(), bt.stride(-1), bt.dtype, dev if dev >= 0 else bt.device, bt.data_ptr() & 15)


def index_key(t: torch.Tensor) -> tuple:
    """A per-sequence index tensor's part (``cu_seqlens``, ``seq_lens``...): its rank, stride, dtype, device
    and alignment (the batch varies)."""
    dev = t.get_device()
    return (t.dim(), t.stride(), t.dtype, dev if dev >= 0 else t.device, t.data_ptr() & 15)


class Seen:
    """The signatures seen before, each with what its first call prepared; at most ``maxsize`` (the
    oldest dropped first). A key that does not hash (arguments of the wrong types, which the full checks
    reject) is neither found nor kept."""

    def __init__(self, maxsize: int = 256) -> None:
        self.maxsize = maxsize
        self.entries: dict = {}

    def __len__(self) -> int:
        return len(self.entries)

    def clear(self) -> None:
        self.entries.clear()

    def lookup(self, key: tuple):
        try:
            return self.entries.get(key)
        except TypeError:
            return None

    def remember(self, key: tuple, prepared) -> None:
        try:
            if key not in self.entries and len(self.entries) >= self.maxsize:
                self.entries.pop(next(iter(self.entries)))
            self.entries[key] = prepared
        except TypeError:
            pass


def bump_versions(
    out: torch.Tensor, lse: torch.Tensor | None = None, status: torch.Tensor | None = None
) -> None:
    """The autograd version counters of the tensors a launch wrote (``lse``, ``status`` where given), in
    one call (a no-op for inference-mode tensors)."""
    if lse is None and status is None:
        torch.autograd.graph.increment_version(out)
    else:
        torch.autograd.graph.increment_version([t for t in (out, lse, status) if t is not None])
