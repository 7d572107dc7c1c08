"""A model of the persistent form's ring protocol (``prefix_prefill.gluon_kernel._persistent_partitions``),
for the CPU tests: the four partitions (two consumer warpgroups, the K-and-Q producer, the V producer) as
Python generators over mbarriers with the hardware's parity waits, TMA copies that land at random later
steps, and a scheduler that runs whichever partition or copy it picks at random.

Each partition follows the kernel's arithmetic: tile ``i`` of the program has ``n`` key blocks, block ``j``
is the rings' block ``r = base + j`` in slot ``r % S`` of round ``r // S`` (``base`` the blocks of the tiles
before); the consumers wait for Q at parity ``i & 1``, release each K slot after its ``Q K^T``, each V slot
after its ``P @ V`` (the last block's too), arrive on ``q_empty`` after the tile's last ``Q K^T``, and meet at
``fix_bar`` for the V-row fixes of blocks that stick out of their segment; the K producer waits for
``q_empty`` at parity ``(i & 1) ^ 1`` before loading Q. Every read checks that the slot holds the block it
expects, at the wait and again at the release (the wgmma reads in between), so a copy that lands too early
shows as an overwrite; a state where nothing can run shows as a deadlock.

``Faults`` switches off one rule each, for the negative controls: the last V slot never released (a
one-tile program's end), the rings counted from 0 at each tile, Q loaded without waiting for ``q_empty``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


class ProtocolError(AssertionError):
    """An overwrite, a wrong read or a deadlock of the modelled protocol."""


class Barrier:
    """An mbarrier: ``count`` arrivals (or a copy's landing) complete a phase; ``passes(parity)`` is the
    hardware's parity wait (true once the phase of that parity completed, so a fresh barrier passes
    parity 1)."""

    def __init__(self, count: int) -> None:
        self.count, self.pending, self.phases = count, 0, 0

    def arrive(self) -> None:
        self.pending += 1
        if self.pending == self.count:
            self.pending, self.phases = 0, self.phases + 1

    def passes(self, parity: int) -> bool:
        return (self.phases & 1) != parity


@dataclass(frozen=True)
class Faults:
    keep_last_v: bool = False  # the consumers never release the last block's V slot
    reset_base: bool = False  # the rings counted from block 0 at each tile
    skip_q_empty: bool = False  # the K producer loads Q without waiting for q_empty


@dataclass(frozen=True)
class Tile:
    skip: bool
    blocks: int
    out: tuple[bool, ...]  # per block: sticks out of its segment (a V-row fix)


def random_tiles(rng: random.Random, count: int) -> list[Tile]:
    tiles = []
    for _ in range(count):
        n = rng.randint(1, 5)
        tiles.append(Tile(rng.random() < 0.2, n, tuple(rng.random() < 0.4 for _ in range(n))))
    return tiles


class Program:
    """One persistent program over ``tiles`` with ``stages`` ring slots (K and V alike)."""

    def __init__(self, tiles: list[Tile], stages: int, faults: Faults, rng: random.Random) -> None:
        self.tiles, self.s, self.f, self.rng = tiles, stages, faults, rng
        self.q = [None, None]  # the Q halves' tags
        self.k = [None] * stages  # the slots' tags: (tile, block)
        self.v = [None] * stages
        self.q_bar = [Barrier(1), Barrier(1)]
        self.k_ready = [Barrier(1) for _ in range(stages)]
        self.v_ready = [Barrier(1) for _ in range(stages)]
        self.k_empty = [Barrier(2) for _ in range(stages)]
        self.v_empty = [Barrier(2) for _ in range(stages)]
        self.q_empty = Barrier(2)
        self.fix_bar = Barrier(2)
        self.copies: list[tuple] = []  # TMA copies in flight: (buffer, index, tag, barrier)

    # ---------------------------------------------------------------- the partitions
    def _base(self, base: int) -> int:
        return 0 if self.f.reset_base else base

    def producer(self, kv: int):
        base = done = 0
        if kv == 0:
            ring, empty, ready = self.k, self.k_empty, self.k_ready
        else:
            ring, empty, ready = self.v, self.v_empty, self.v_ready
        for i, t in enumerate(self.tiles):
            if t.skip:
                continue
            if kv == 0:
                if not self.f.skip_q_empty:
                    yield from self._wait(self.q_empty, (done & 1) ^ 1)
                for h in range(2):
                    self.copies.append((self.q, h, i, self.q_bar[h]))
            for j in range(t.blocks):
                r = self._base(base) + j
                yield from self._wait(empty[r % self.s], ((r // self.s) & 1) ^ 1)
                self.copies.append((ring, r % self.s, (i, j), ready[r % self.s]))
            base += t.blocks
            done += 1

    def _read(self, buf: list, slot: int, tag) -> None:
        if buf[slot] != tag:
            raise ProtocolError(f"slot {slot} holds {buf[slot]}, expected {tag}")

    def consumer(self, wg: int):
        base = done = n_fix = 0
        for i, t in enumerate(self.tiles):
            if t.skip:
                continue
            b = self._base(base)
            yield from self._wait(self.q_bar[wg], done & 1)
            self._read(self.q, wg, i)
            s0 = b % self.s
            yield from self._wait(self.k_ready[s0], (b // self.s) & 1)
            self._read(self.k, s0, (i, 0))
            yield True  # Q K^T_0 in flight
            self._read(self.k, s0, (i, 0))
            self.k_empty[s0].arrive()
            for j in range(1, t.blocks):
                r = b + j
                yield from self._wait(self.k_ready[r % self.s], (r // self.s) & 1)
                self._read(self.k, r % self.s, (i, j))
                p = r - 1
                yield from self._wait(self.v_ready[p % self.s], (p // self.s) & 1)
                self._read(self.v, p % self.s, (i, j - 1))
                if t.out[j - 1]:
                    n_fix = yield from self._fix(n_fix)
                yield True  # S_j and P_{j-1} V_{j-1} in flight
                self._read(self.k, r % self.s, (i, j))
                self._read(self.v, p % self.s, (i, j - 1))
                self.k_empty[r % self.s].arrive()
                self.v_empty[p % self.s].arrive()
            self._read(self.q, wg, i)
            self.q_empty.arrive()
            last = b + t.blocks - 1
            yield from self._wait(self.v_ready[last % self.s], (last // self.s) & 1)
            self._read(self.v, last % self.s, (i, t.blocks - 1))
            if t.out[-1]:
                n_fix = yield from self._fix(n_fix)
            yield True  # the last P @ V in flight
            self._read(self.v, last % self.s, (i, t.blocks - 1))
            if not self.f.keep_last_v:
                self.v_empty[last % self.s].arrive()
            base += t.blocks
            done += 1

    @staticmethod
    def _wait(bar: Barrier, parity: int):
        """A parity wait: yields False while it blocks, True once it passed (progress)."""
        while not bar.passes(parity):
            yield False
        yield True

    def _fix(self, n_fix: int):
        self.fix_bar.arrive()
        yield from self._wait(self.fix_bar, n_fix & 1)
        return n_fix + 1

    # ---------------------------------------------------------------- the scheduler
    def run(self, max_steps: int = 400_000) -> None:
        """Runs to the end; raises :class:`ProtocolError` on an overwrite, a wrong read or a deadlock (no
        copy in flight and no partition moving over many random picks)."""
        agents = [self.consumer(0), self.consumer(1), self.producer(0), self.producer(1)]
        blocked = 0
        for _ in range(max_steps):
            if not agents and not self.copies:
                return
            pick = self.rng.randrange(len(agents) + len(self.copies))
            if pick >= len(agents):  # a copy lands
                buf, index, tag, bar = self.copies.pop(pick - len(agents))
                buf[index] = tag
                bar.arrive()
                blocked = 0
                continue
            agent = agents[pick]
            try:
                moved = next(agent)
            except StopIteration:
                agents.remove(agent)
                blocked = 0
                continue
            blocked = 0 if moved or self.copies else blocked + 1
            if blocked > 400 * len(agents):
                raise ProtocolError("deadlock: every partition waits and no copy is in flight")
        raise ProtocolError("no end within the step limit")


def check(seed: int, tiles: int = 12, stages: int = 2, faults: Faults = Faults()) -> None:
    """One random program of ``tiles`` tiles; raises :class:`ProtocolError` on a protocol fault."""
    rng = random.Random(seed)
    Program(random_tiles(rng, tiles), stages, faults, rng).run()
