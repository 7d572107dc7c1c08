"""The launch plan both kernel packages produce: which kernel runs a call, with which settings, and why.

Each kernel package has one pure ``plan(problem) -> LaunchPlan`` (``window_prefill.plan``,
``prefix_prefill.plan``): its ``problem`` is a frozen, hashable record of what the host knows of a
call without reading device memory (dtypes, head counts and sizes, strides, page size, alignment,
options, the architecture), never a sequence length or a batch size, so one plan serves every step of
an engine and a plan cache keyed by the problem stays small. The launchers run exactly what the plan
says; ``bench/`` and tests override a plan (:meth:`LaunchPlan.replace`) instead of module globals.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LaunchPlan:
    """One kernel launch, decided.

    ``kernel``: the kernel's name in its package (e.g. ``"triton"``, ``"gluon"``, ``"gluon-split"``);
    ``reason``: the rule that chose it (and why a faster kernel did not apply); ``block_m``: query rows
    per program, the query-tile size of the grid; ``constexprs``: the kernel's compile-time parameters;
    ``options``: launch options (``num_warps``, ``num_stages``, ``ptx_options``...); ``extra``:
    package-specific host settings (descriptor blocks, compile tiers). Mappings are stored as sorted
    tuples so that a plan is hashable; read them with :meth:`consts` and :meth:`opts`.
    """

    kernel: str
    reason: str
    block_m: int
    constexprs: tuple[tuple[str, object], ...] = ()
    options: tuple[tuple[str, object], ...] = ()
    extra: tuple[tuple[str, object], ...] = field(default=())

    @staticmethod
    def items(m: Mapping[str, object]) -> tuple[tuple[str, object], ...]:
        """A mapping as the sorted tuple a plan stores."""
        return tuple(sorted(m.items()))

    def consts(self) -> dict[str, object]:
        """The constexprs as a new dict (the caller may change it)."""
        return dict(self.constexprs)

    @functools.cached_property
    def constexpr_map(self) -> Mapping[str, object]:
        """The constexprs as a read-only mapping, built once per plan: for rules a launcher asks per call
        (a dict lookup instead of a scan of ``constexprs``)."""
        return types.MappingProxyType(dict(self.constexprs))

    def opts(self) -> dict[str, object]:
        return dict(self.options)

    def get(self, name: str, default: object = None) -> object:
        """An ``extra`` setting."""
        return dict(self.extra).get(name, default)

    def replace(self, *, constexprs: Mapping[str, object] | None = None, **changes: object) -> LaunchPlan:
        """A copy with fields changed; ``constexprs`` entries are merged into the plan's (A/B runs)."""
        if constexprs is not None:
            changes["constexprs"] = self.items({**self.consts(), **constexprs})
        return dataclasses.replace(self, **changes)


def packed_tokens(half_m: int, group: int) -> int:
    """Tokens a packed consumer warpgroup holds of each of ``group`` query heads (``prefill_runtime.gluon
    .consumer``'s ``PACK``): the most that fit its ``half_m`` rows in whole 8-row swizzle atoms (a head's
    rows start on one, where its Q box lands); 0 where not one atom a head fits (``group > half_m / 8``)."""
    return (half_m // group) // 8 * 8 if group > 0 else 0
