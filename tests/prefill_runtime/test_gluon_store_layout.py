"""The layout the Gluon consumer stores a 16-bit O from (``prefill_runtime.gluon._store_layout``), on the CPU.

Both layouts are evaluated from their bases (a linear layout: an element's ``(row, col)`` is the XOR of
the bases of its set register, lane and warp bits) beside the wgmma accumulator's layout written out the
same way (each warp 16 rows, lane ``l`` on row ``l // 4`` and columns ``2 * (l % 4) + {0, 1} + 8k``, a
thread's second row 8 below). Checked: every element once; each element on the lane and warp that hold
its row in the accumulator, so the conversion moves values only within a quad of lanes (a shuffle, no
shared memory); and each lane's registers in runs of 4 contiguous columns, a quad's four runs 32
contiguous bytes of a row, so one store writes whole 32-byte sectors. A negative control: the
accumulator's own layout fails the sector check. The GPU tests check the stored values.
"""

import itertools

import pytest

gluon_mod = pytest.importorskip("prefill_runtime.gluon", exc_type=ImportError)


def _accumulator(rows, head_dim, warps):
    """The wgmma accumulator's bases ([16, head_dim, 16] instructions, ``warps`` warps along rows)."""
    reg = [[0, 1], [8, 0]] + [[0, 8 << i] for i in range((head_dim // 8).bit_length() - 1)]
    lane = [[0, 2], [0, 4], [1, 0], [2, 0], [4, 0]]
    warp = [[16 << i, 0] for i in range(warps.bit_length() - 1)]
    return reg, lane, warp


def _elements(reg, lane, warp):
    """``{(register, lane, warp): (row, col)}`` of a linear layout's bases."""
    out = {}
    for r, ln, w in itertools.product(range(1 << len(reg)), range(1 << len(lane)), range(1 << len(warp))):
        row = col = 0
        for bits, bases in ((r, reg), (ln, lane), (w, warp)):
            for i, (br, bc) in enumerate(bases):
                if bits >> i & 1:
                    row ^= br
                    col ^= bc
        out[(r, ln, w)] = (row, col)
    return out


def _sector_runs(elements, elem_bytes=2):
    """Whether each lane's registers come in runs of 4 contiguous columns and a quad's runs at one
    register index cover 32 contiguous bytes of one row."""
    for (r, ln, w), (row, col) in elements.items():
        if r % 4 == 0:
            run = [elements[(r + i, ln, w)] for i in range(4)]
            if run != [(row, col + i) for i in range(4)]:
                return False
            if ln % 4 == 0:
                quad = sorted(elements[(r + i, ln + q, w)] for q in range(4) for i in range(4))
                if quad != [(row, col + i) for i in range(16)] or (col * elem_bytes) % 32:
                    return False
    return True


@pytest.mark.parametrize("rows,head_dim,warps", [(64, 64, 4), (64, 128, 4), (64, 256, 4), (128, 128, 8)])
def test_store_layout_is_a_quad_shuffle_to_whole_sectors(rows, head_dim, warps):
    layout = gluon_mod._store_layout(rows, head_dim, warps)
    assert list(layout.shape) == [rows, head_dim]
    store = _elements(layout.reg_bases, layout.lane_bases, layout.warp_bases)
    acc = _elements(*_accumulator(rows, head_dim, warps))
    cells = [(i, j) for i in range(rows) for j in range(head_dim)]
    assert sorted(store.values()) == cells and sorted(acc.values()) == cells  # each element once
    acc_home = {v: (ln // 4, w) for (_r, ln, w), v in acc.items()}  # (the lane's row within the warp, warp)
    for (_r, ln, w), v in store.items():
        assert acc_home[v] == (ln // 4, w), v  # within the quad that holds the row
    assert _sector_runs(store)
    assert not _sector_runs(acc)  # negative control: the accumulator stores half sectors
