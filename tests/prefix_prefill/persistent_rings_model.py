"""A model of the persistent form's ring protocol (``prefix_prefill.gluon_kernel._persistent_partitions``),
for the CPU tests: the four partitions (two consumer warpgroups, the K-and-Q producer, the V producer) as
Python generators over mbarriers with the hardware's parity waits, TMA copies that land at random later
steps, and a scheduler that runs whichever partition or copy it picks at random (in some runs one
partition picked far less often than the others: a lagging warp).

Each partition follows the kernel's arithmetic: tile ``i`` of the program has ``n`` key blocks, block ``j``
is the rings' block ``r = base + j`` in slot ``r % S`` of round ``r // S`` (``base`` the blocks of the tiles
before); the consumers wait for Q at parity ``i & 1``, release each K slot after its ``Q K^T``, each V slot
after its ``P @ V`` (the last block's too), arrive on ``q_empty`` after the tile's last ``Q K^T``, and meet at
``fix_bar`` for the V-row fixes of blocks that stick out of their segment; the K producer waits for
``q_empty`` at parity ``(i & 1) ^ 1`` before loading Q. Every read checks that the slot holds the block it
expects, at the wait and again at the release (the wgmma reads in between), so a copy that lands too early
shows as an overwrite; a state where nothing can run shows as a deadlock.

The tiles reach the partitions as the kernel hands them over: the K producer takes every tile, skips
those with nothing to compute, and writes each other one (then -1, the end) into tile slot ``n & 1`` once
the V producer freed that slot (``free``, parity ``((n >> 1) & 1) ^ 1``), announced on ``full``; the V
producer reads it after ``full`` and frees the slot; the consumers read it once the tile's Q landed (after
the end, the K producer's bare arrival on both Q barriers once ``q_empty`` says the last Q is free). A slot
written while a partition still has to read its tile shows as an overwrite; a read of another tile than
the reader's next one as a wrong read.

``Faults`` switches off one rule each, for the negative controls: the last V slot never released (a
one-tile program's end), the rings counted from 0 at each tile, Q loaded without waiting for ``q_empty``,
one tile slot instead of two, a slot written without waiting for ``free``.
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
    one_slot: bool = False  # one tile slot (and one full/free pair) instead of two
    skip_free: bool = False  # the K producer writes a tile slot without waiting for free


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
        self.n_slots = 1 if faults.one_slot else 2
        self.slots: list = [None] * self.n_slots  # (n, tile index or -1): the K producer's n-th handover
        self.unread: list[set] = [set() for _ in range(self.n_slots)]  # readers yet to read each slot
        self.full = [Barrier(1) for _ in range(self.n_slots)]
        self.free = [Barrier(1) for _ in range(self.n_slots)]

    # ---------------------------------------------------------------- the partitions
    def _base(self, base: int) -> int:
        return 0 if self.f.reset_base else base

    def producer(self, kv: int):
        base = n = 0
        if kv == 0:  # takes every tile, hands over those with work, then -1
            for i, t in enumerate(self.tiles):
                if t.skip:
                    continue
                yield from self._hand_over(n, i)
                if not self.f.skip_q_empty:
                    yield from self._wait(self.q_empty, (n & 1) ^ 1)
                for h in range(2):
                    self.copies.append((self.q, h, i, self.q_bar[h]))
                yield from self._blocks(self.k, self.k_empty, self.k_ready, base, i)
                base += self.tiles[i].blocks
                n += 1
            yield from self._hand_over(n, -1)
            yield from self._wait(self.q_empty, (n & 1) ^ 1)
            for h in range(2):
                self.q_bar[h].arrive()
            return
        i = yield from self._take("v", n, self.full)
        while i >= 0:
            self.free[n % self.n_slots].arrive()
            yield from self._blocks(self.v, self.v_empty, self.v_ready, base, i)
            base += self.tiles[i].blocks
            n += 1
            i = yield from self._take("v", n, self.full)

    def _blocks(self, ring: list, empty: list, ready: list, base: int, i: int):
        for j in range(self.tiles[i].blocks):
            r = self._base(base) + j
            yield from self._wait(empty[r % self.s], ((r // self.s) & 1) ^ 1)
            self.copies.append((ring, r % self.s, (i, j), ready[r % self.s]))

    def _hand_over(self, n: int, i: int):
        """The K producer's ``n``-th handover (tile ``i``, -1: the end) into slot ``n % slots``."""
        s = n % self.n_slots
        if not self.f.skip_free:
            yield from self._wait(self.free[s], ((n // self.n_slots) & 1) ^ 1)
        if self.unread[s]:
            readers = sorted(map(str, self.unread[s]))
            raise ProtocolError(f"tile slot {s} overwritten before {readers} read it")
        self.slots[s], self.unread[s] = (n, i), {"v", 0, 1}
        self.full[s].arrive()

    def _take(self, reader, n: int, bar: list | None):
        """Reader ``reader``'s ``n``-th tile from its slot (after ``bar[slot]``'s wait when given: the V
        producer's ``full``; the consumers read after their Q barrier's)."""
        s = n % self.n_slots
        if bar is not None:
            yield from self._wait(bar[s], (n // self.n_slots) & 1)
        if self.slots[s] is None or self.slots[s][0] != n:
            raise ProtocolError(f"tile slot {s} holds {self.slots[s]}, {reader} expected handover {n}")
        self.unread[s].discard(reader)
        return self.slots[s][1]

    def _read(self, buf: list, slot: int, tag) -> None:
        if buf[slot] != tag:
            raise ProtocolError(f"slot {slot} holds {buf[slot]}, expected {tag}")

    def consumer(self, wg: int):
        base = n = n_fix = 0
        yield from self._wait(self.q_bar[wg], 0)
        i = yield from self._take(wg, n, None)
        while i >= 0:
            t = self.tiles[i]
            b = self._base(base)
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
            n += 1
            yield from self._wait(self.q_bar[wg], n & 1)  # the next tile's Q, or the end
            i = yield from self._take(wg, n, None)

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
        # each partition's pace for this run: some runs have a partition picked 20x less often than the
        # others (a lagging warp), which is what exposes a handover written before a slow reader read it
        pace = {id(a): self.rng.choice((1.0, 1.0, 0.05)) for a in agents}
        blocked = 0
        for _ in range(max_steps):
            if not agents and not self.copies:
                return
            weights = [pace[id(a)] for a in agents] + [1.0] * len(self.copies)
            pick = self.rng.choices(range(len(weights)), weights)[0]
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
            if blocked > 8000 * len(agents):
                raise ProtocolError("deadlock: every partition waits and no copy is in flight")
        raise ProtocolError("no end within the step limit")


def check(seed: int, tiles: int = 12, stages: int = 2, faults: Faults = Faults()) -> None:
    """One random program of ``tiles`` tiles; raises :class:`ProtocolError` on a protocol fault."""
    rng = random.Random(seed)
    Program(random_tiles(rng, tiles), stages, faults, rng).run()
