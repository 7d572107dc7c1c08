"""A :class:`prefill_runtime.compiled_launch.Frame`'s call on the CPU: the per-call slots written into
a copy of its template, and a per-call descriptor filled again exactly when its pointer or token count
differs from its previous fill (an engine layer called again over the same buffers fills nothing; a call
over other buffers, or of another length, never launches a stale map)."""

from __future__ import annotations

import prefill_runtime.compiled_launch as cl


def _frame():
    """A frame of two per-call descriptors (token count at dim 0 and 1 of their shapes) and two plain
    slots, over a recording C launcher and a counting filler."""
    fills: list[tuple] = []
    launched: list[list] = []

    def fill(ptr, swizzle, elem, dtype, block, shape, strides, padding):
        fills.append((ptr, tuple(shape)))
        return ("map", ptr, tuple(shape), len(fills))  # (which fill made it)

    # template: grid x3, stream, function, then desc A (map, 2 dims, 2 strides), desc B (map, 2 dims,
    # 2 strides), two plain slots
    template = [0, 0, 0, 0, "fn", None, 64, 128, 128, 1, None, 8, 0, 8, 1, "o", "n"]
    descs = [(5, 0, [0, 128], [128, 1], 1, 2, 3, [64, 128]), (10, 1, [8, 0], [8, 1], 1, 2, 3, [8, 64])]
    frame = cl.Frame(None, lambda *a: launched.append(list(a)), template, descs, [15, 16], fill)
    return frame, fills, launched


def test_frame_writes_the_per_call_slots():
    frame, fills, launched = _frame()
    assert fills == []
    frame(3, 4, 5, 99, 37, (1000, 2000), (7, 8))
    got = launched[-1]
    assert got[:5] == [3, 4, 5, 99, "fn"]
    assert got[5] == ("map", 1000, (37, 128), 1) and got[6] == 37
    assert got[10] == ("map", 2000, (8, 37), 2) and got[12] == 37
    assert got[15:] == [7, 8] and len(fills) == 2
    template = frame._state[0]  # (the first entry of the state a call reads)
    assert template[5] is None and template[6] == 64  # the template itself is untouched


def test_frame_fills_again_only_when_pointer_or_tokens_change():
    frame, fills, launched = _frame()
    frame(1, 1, 1, 0, 37, (1000, 2000), (7, 8))
    frame(1, 1, 1, 0, 37, (1000, 2000), (7, 9))
    assert len(fills) == 2 and launched[1][5] is launched[0][5] and launched[1][10] is launched[0][10]
    frame(1, 1, 1, 0, 37, (1000, 3000), (7, 9))  # another B pointer: B filled again, A kept
    assert fills[2:] == [(3000, (8, 37))] and launched[2][10][1] == 3000 and launched[2][5] is launched[0][5]
    frame(1, 1, 1, 0, 12, (1000, 3000), (7, 9))  # another token count: both filled again
    assert fills[3:] == [(1000, (12, 128)), (3000, (8, 12))]
    assert launched[3][5][2] == (12, 128) and launched[3][6] == 12 and launched[3][12] == 12
    frame(1, 1, 1, 0, 37, (1000, 2000), (7, 9))  # back to the first buffers: filled again (one kept a slot)
    assert len(fills) == 7 and launched[4][5][1:3] == (1000, (37, 128)) and launched[4][10][1] == 2000
