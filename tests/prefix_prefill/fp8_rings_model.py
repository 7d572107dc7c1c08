"""A model of the barrier protocol of the NHD Gluon kernel's fp8 forms (``prefix_prefill.gluon_kernel``:
``_fp8_producer``, ``_fp8_converter``, the consumers of ``prefill_runtime.gluon.consumer``), played in
random interleavings by :func:`play` (test_pp_gluon_fp8.py's protocol tests).

Each partition is a generator that yields the mbarrier wait it blocks on (``("wait", barrier, parity)``)
and otherwise acts at once: arrivals, TMA copies (their bytes land at a random later turn, completing the
expect-tx), reads and writes of the staging slots and ring slots. A barrier's parity wait passes when its
completed phases differ in parity from the one asked (the hardware's rule: a wait two phases behind
passes too, which is what a producer running ahead of the converter would hit). The checks: no write
(a converter's store, a landing copy) touches a slot a reader still holds, every read sees the block it
expects, nothing deadlocks, and both consumers get every block of K and V.
"""

from __future__ import annotations

import random


class Barrier:
    """An mbarrier: ``count`` arrivals and the expected transaction bytes complete a phase."""

    def __init__(self, count: int) -> None:
        self.count, self.arrived, self.tx, self.phases = count, 0, 0, 0

    def arrive(self, tx: int = 0) -> None:
        self.arrived += 1
        self.tx += tx
        self._complete()

    def land(self, tx: int) -> None:
        self.tx -= tx
        self._complete()

    def _complete(self) -> None:
        if self.arrived == self.count and self.tx == 0:
            self.arrived = 0
            self.phases += 1

    def passes(self, parity: int) -> bool:
        return (self.phases & 1) != parity


class Slot:
    """A shared-memory slot: the block it holds and the readers holding it."""

    def __init__(self, name: str) -> None:
        self.name, self.block, self.readers = name, None, set()


class Protocol(Exception):
    """A violation of the protocol (what and where)."""


def _write(slot: Slot, block) -> None:
    if slot.readers:
        raise Protocol(f"{slot.name} overwritten with {block} while {sorted(slot.readers)} read {slot.block}")
    slot.block = block


def _read(slot: Slot, who: str, block) -> None:
    if slot.block != block:
        raise Protocol(f"{who} reads {slot.name} for {block}, holding {slot.block}")
    slot.readers.add(who)


def _done(slot: Slot, who: str, block) -> None:
    if slot.block != block:
        raise Protocol(f"{who}'s read of {block} in {slot.name} saw {slot.block} by its end")
    slot.readers.discard(who)


def play(n_a: int, n_blocks: int, rng: random.Random, stages: int = 2, staging: int = 2,
         wait_for_converter: bool = True) -> list:  # fmt: skip
    """Play one program of ``n_blocks`` key blocks, ``n_a`` of them context blocks from an fp8 cache, in a
    random interleaving; returns each consumer's blocks in the order it read them (raises
    :class:`Protocol` on a violation or a deadlock). ``wait_for_converter``: the producers wait for the
    converter's last context block before their first new-token block (the kernel's rule; False: the
    negative control)."""
    ring = {kv: [Slot(f"{kv} ring {i}") for i in range(stages)] for kv in "KV"}
    stage = {kv: [Slot(f"{kv} staging {i}") for i in range(staging)] for kv in "KV"}
    ready = {kv: [Barrier(1) for _ in range(stages)] for kv in "KV"}
    empty = {kv: [Barrier(2) for _ in range(stages)] for kv in "KV"}
    st_ready = {kv: [Barrier(1) for _ in range(staging)] for kv in "KV"}
    st_empty = {kv: [Barrier(1) for _ in range(staging)] for kv in "KV"}
    copies: list = []  # TMA copies in flight: (slot, block, barrier)
    seen: dict = {0: [], 1: []}

    def producer(kv: str):
        for j in range(n_a):
            s = j % staging
            yield ("wait", st_empty[kv][s], ((j // staging) & 1) ^ 1)
            st_ready[kv][s].arrive(tx=1)
            copies.append((stage[kv][s], (kv, j), st_ready[kv][s]))
        if wait_for_converter and n_a > 0 and n_blocks > n_a:
            last = n_a - 1
            yield ("wait", st_empty[kv][last % staging], (last // staging) & 1)
        for j in range(n_a, n_blocks):
            s = j % stages
            yield ("wait", empty[kv][s], ((j // stages) & 1) ^ 1)
            ready[kv][s].arrive(tx=1)
            copies.append((ring[kv][s], (kv, j), ready[kv][s]))

    def converter():
        for j in range(n_a):
            for kv in "KV":
                s, r = j % staging, j % stages
                yield ("wait", st_ready[kv][s], (j // staging) & 1)
                yield ("wait", empty[kv][r], ((j // stages) & 1) ^ 1)
                _read(stage[kv][s], "converter", (kv, j))
                _write(ring[kv][r], (kv, j))
                _done(stage[kv][s], "converter", (kv, j))
                ready[kv][r].arrive()
                st_empty[kv][s].arrive()

    def consumer(wg: int):
        who = f"consumer {wg}"

        def take(kv, j):
            s = j % stages
            yield ("wait", ready[kv][s], (j // stages) & 1)
            _read(ring[kv][s], who, (kv, j))

        def give(kv, j):
            _done(ring[kv][j % stages], who, (kv, j))
            empty[kv][j % stages].arrive()
            seen[wg].append((kv, j))

        yield from take("K", 0)
        give("K", 0)
        for j in range(1, n_blocks):
            yield from take("K", j)  # S_j issued
            yield from take("V", j - 1)  # P_{j-1} V_{j-1} issued
            give("K", j)  # S_j done: K_j released
            yield ("step",)
            give("V", j - 1)  # P V done
        yield from take("V", n_blocks - 1)
        give("V", n_blocks - 1)

    actors = [producer("K"), producer("V"), converter(), consumer(0), consumer(1)]
    waits: list = [("step",)] * len(actors)
    while actors or copies:
        runnable = [i for i, w in enumerate(waits) if w[0] == "step" or w[1].passes(w[2])]
        choices = [("actor", i) for i in runnable] + [("copy", i) for i in range(len(copies))]
        if not choices:
            raise Protocol(f"deadlock: {len(actors)} partitions wait")
        kind, i = rng.choice(choices)
        if kind == "copy":
            slot, block, bar = copies.pop(i)
            _write(slot, block)
            bar.land(1)
            continue
        try:
            waits[i] = next(actors[i])
        except StopIteration:
            del actors[i], waits[i]
    return [seen[0], seen[1]]
