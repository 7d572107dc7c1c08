"""The compile-check matrix: which calls are planned on each target, and the launches their plans make.

A :class:`Case` is one call of a kernel package (``prefix`` or ``window``) on one target: head size,
dtypes, cache layout and page size (prefix), a form (the options the call sets) and whether the cache
or the tensors are too large for 32-bit offsets. :func:`launches` plans it with the package's own
``plan()`` (the architecture from the package's ``detect_arch`` on the emulated device) and runs the
package's own launcher on ``meta`` tensors (no memory) with the kernel replaced by a recorder, so
each recorded launch holds exactly the arguments, constexprs and options the launcher passes Triton.

The matrix (:func:`cases`) covers, for every target, every table entry the plan can pick (head-size
bucket x dtype class; the window table's causality too) in each cache layout, both 16-bit dtypes and
fp32, fp8 caches and fp8 output (prefix), page sizes 1, 8, 16, 24, 544 and 1056 (prefix), every option (causal
or not, left/right windows, ALiBi, sinks of both modes, soft-capping, skip_decode, k=None, the LSE) in
the combinations models use (:data:`PREFIX_FORMS`, :data:`WINDOW_FORMS`), 64-bit offsets, and every
head-size class (the exact bucket sizes 64/128/256, the padded 80/192, the narrow 32 and 8). On
sm90 every case is planned twice: with the Gluon kernels available, whatever this Triton is (the plan
picks them where they apply; :func:`gluon_offered` says whether the packages offer them here, which
decides whether their spill verdict binds, cc_targets) and without (the Triton kernel, as on a
Triton outside ``prefill_runtime``'s Gluon allowlist).
Rather than the full product of the axes (tens of thousands of compiles), each axis value is crossed
with every table entry and layout at least once;
identical launches (the same specialisation, constexprs and options) are compiled once (cc_run).
"""

from __future__ import annotations

import dataclasses
import os
import types
from dataclasses import dataclass

import torch
from cc_targets import TARGETS, Target, emulated_device

#: forms of a prefix-prefill call: the options it sets, as the models that use them combine them
#: (``k_none``: the new tokens' K/V read from the cache; ``short``: queries of at most 4 tokens, the
#: short-query forms, where the other forms' ``max_query_len`` of 96 takes the full ones; ``batch``:
#: sequences, default 2: with 32 the Gluon short-query grid passes one wave of the target's
#: multiprocessors, and the paired-heads form replaces the idle one). Every option is in at least one form.
PREFIX_FORMS: dict[str, dict] = {
    "causal": {},
    "sliding_sinks": dict(left=1023, sinks=True, lse=True),  # gpt-oss (its LSE for cascades)
    "sliding_softcap": dict(left=4095, softcap=30.0),  # Gemma 2
    "alibi": dict(alibi=True, skip_decode=True),  # BLOOM/MPT, a batch with decode rows
    "bidirectional": dict(causal=False, left=100, right=30),  # encoder-style, windowed both ways
    "k_none": dict(k_none=True, lse=True),
    "specdec": dict(short=True, lse=True),  # speculative decoding: a few tokens a sequence
    "specdec_batch": dict(short=True, lse=True, batch=32),  # ... over a batch past one wave
}
#: (page, form) of the sm90 rows that take the Gluon kernels, per head size and layout
GLUON_PAGE_FORMS = ((16, "causal"), (544, "causal"), (1056, "k_none"), (16, "specdec"), (16, "specdec_batch"))
#: (page, form) of the sm90 rows over an HND cache (the NHD kernel reading one head's slots a row view)
GLUON_HND_PAGE_FORMS = ((16, "causal"), (544, "sliding_sinks"), (8, "causal"), (24, "sliding_sinks"))
#: multiprocessors of the targets the Gluon launcher weighs a short-query batch against (H100/H200)
MULTIPROCESSORS = {"sm90": 132}
#: forms of a window-prefill call (``lens``: starts and lengths, vLLM's form, instead of cu_seqlens;
#: ``wide_window``: rows see >= 2048 keys, where the Gluon kernel may take it)
WINDOW_FORMS: dict[str, dict] = {
    "causal": dict(wide_window=True),
    "sliding_sinks": dict(left=255, sinks="denominator", lse=True, lens=True),
    "sliding_softcap": dict(left=4095, softcap=30.0),
    "bidirectional": dict(causal=False, left=100, right=30, sinks="bias_key0"),
    "noncausal": dict(causal=False, wide_window=True),
    "window_lse": dict(left=4095, lse=True, wide_window=True),
    "alibi_sinks": dict(left=1023, alibi=True, sinks="bias_key0", lse=True),  # ALiBi with a key-0 sink
}
#: head sizes per table bucket: (the narrower or padded class, the exact bucket size)
HEADS = {64: (32, 64), 128: (80, 128), 256: (192, 256)}
#: the narrowest class (a tile narrower than one dot's K of 16)
TINY_HEAD = 8
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
HEADS_Q, HEADS_KV = 8, 2


@dataclass(frozen=True)
class Case:
    """One planned call (module docstring). ``dtype``: q's (``fp16``/``bf16``/``fp32``); ``cache``/``out``:
    ``fp8`` for the target's fp8 type, else q's; ``wide``: tensors past 2**31 elements (64-bit offsets);
    ``gluon``: the Gluon kernels available (sm90)."""

    package: str
    target: str
    head: int
    dtype: str
    form: str
    layout: str = ""
    page: int = 0
    cache: str = ""
    out: str = ""
    wide: bool = False
    gluon: bool = False

    def label(self) -> str:
        parts = [self.package, self.target, f"d{self.head}", self.dtype, self.form]
        if self.package == "prefix":
            parts += [self.layout, f"p{self.page}"]
        parts += [f"cache-{self.cache}"] if self.cache else []
        parts += [f"out-{self.out}"] if self.out else []
        parts += ["wide"] if self.wide else []
        parts += ["gluon"] if self.gluon else []
        return "/".join(parts)


def _prefix_rows(target: str) -> list[Case]:
    """The prefix-prefill cases of one target (module docstring): per bucket 13 rows over its exact and
    its narrower/padded head, then the narrowest head; on sm90 the Gluon kernels' own choices too."""
    rows = []

    def c(head: int, dtype: str, layout: str, page: int, form: str, **kw) -> Case:
        return Case("prefix", target, head, dtype, form, layout, page, **kw)

    for small, exact in HEADS.values():
        rows += [
            c(exact, "bf16", "split", 16, "causal"),  # vLLM's default call
            c(exact, "fp16", "nhd", 16, "sliding_softcap"),  # k/v contiguous over NHD: the merged loop
            c(exact, "bf16", "hnd", 1056, "k_none", wide=True),
            c(exact, "bf16", "split", 544, "sliding_sinks", wide=True),
            c(exact, "fp16", "split", 16, "sliding_sinks", cache="fp8", out="fp8"),
            c(exact, "bf16", "nhd", 16, "causal", cache="fp8"),  # the usual fp8-cache call
            c(small, "fp16", "hnd", 1, "causal"),
            c(small, "bf16", "nhd", 544, "alibi"),
            c(small, "fp16", "split", 16, "bidirectional"),
            c(exact, "fp32", "split", 16, "sliding_softcap"),
            c(small, "fp32", "nhd", 544, "k_none"),
            c(exact, "bf16", "split", 16, "specdec"),  # the short-query forms
            c(exact, "bf16", "nhd", 16, "specdec", cache="fp8"),
        ]
    rows += [c(TINY_HEAD, "bf16", "nhd", 16, "bidirectional"), c(TINY_HEAD, "fp32", "split", 16, "causal")]
    if target == "sm90":  # the Gluon kernels' choices: page vs key block, k given or not, the LSE
        for _, exact in HEADS.values():
            for layout in ("split", "nhd"):
                for page, form in GLUON_PAGE_FORMS:
                    rows.append(c(exact, "bf16", layout, page, form, gluon=True))
            for page, form in GLUON_HND_PAGE_FORMS:  # the NHD kernel over an HND cache's rows
                rows.append(c(exact, "bf16", "hnd", page, form, gluon=True))
        rows += [dataclasses.replace(r, gluon=True) for r in list(rows) if not r.gluon]
    return rows


def _window_rows(target: str) -> list[Case]:
    """The window-prefill cases of one target: per bucket 7 rows, then the narrowest head; on sm90 the
    Gluon kernel's choices too."""
    rows = []

    def c(head: int, dtype: str, form: str, **kw) -> Case:
        return Case("window", target, head, dtype, form, **kw)

    for small, exact in HEADS.values():
        rows += [
            c(exact, "bf16", "causal"),
            c(exact, "fp16", "sliding_sinks", wide=True),
            c(small, "bf16", "sliding_softcap"),
            c(small, "fp16", "bidirectional"),
            c(exact, "fp32", "sliding_sinks"),
            c(small, "bf16", "alibi_sinks"),
            c(exact, "bf16", "bidirectional", out="fp8"),  # an fp8 output (vLLM's fused quantisation)
        ]
    rows.append(c(TINY_HEAD, "fp16", "bidirectional"))
    if target == "sm90":
        for _, exact in HEADS.values():
            rows += [c(exact, "fp16", form) for form in ("noncausal", "window_lse")]
        rows += [dataclasses.replace(r, gluon=True) for r in list(rows)]
    return rows


def cases(targets: list[str] | None = None) -> list[Case]:
    """Every case of the matrix, for ``targets`` (default: all five)."""
    out = []
    for t in targets or list(TARGETS):
        out += _prefix_rows(t) + _window_rows(t)
    return out


# --------------------------------------------------------------------------- planning and capture
@dataclass
class Launch:
    """One recorded launch: the real kernel, its grid, positional and keyword arguments, the plan."""

    kernel: object
    grid: tuple
    args: tuple
    kwargs: dict
    plan: object


class _Recorder:
    """Stands in for a ``@triton.jit`` / ``@gluon.jit`` kernel: ``kernel[grid](*args, **kwargs)`` records."""

    def __init__(self, real, into: list) -> None:
        self.real, self.into = real, into
        self.arg_names = real.arg_names

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.into.append((self.real, grid, args, kwargs))

        return call


def _meta(*shape, dtype) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def _fp8(target: Target) -> torch.dtype:
    return getattr(torch, target.e4m3)


def _softcap_form(softcap: float, device: torch.device, dtype: torch.dtype) -> int:
    """The ``SOFTCAP`` constexpr the launchers pass on ``device`` (emulated) for a ``dtype`` q:
    prefill_runtime's rule."""
    from prefill_runtime import softcap_form

    return softcap_form(softcap, types.SimpleNamespace(is_cuda=True, device=device, dtype=dtype))


def _prefix_tensors(case: Case, target: Target) -> dict:
    """Meta tensors of a prefix call: 64 new tokens of 2 sequences (the form's ``batch``), 8 query heads
    over 2 KV heads."""
    qd = DTYPES[case.dtype]
    cd = _fp8(target) if case.cache == "fp8" else qd
    od = _fp8(target) if case.out == "fp8" else qd
    d, page, hk, tokens = case.head, case.page, HEADS_KV, 64
    opts = PREFIX_FORMS[case.form]
    batch = opts.get("batch", 2)
    blocks = 64 if not case.wide else 2**31 // (page * hk * d) + 1  # past 2**31 elements: 64-bit offsets
    if case.layout == "split":
        x = 16 // cd.itemsize
        x = min(x, d)
        while d % x:
            x //= 2
        kc, vc = _meta(blocks, hk, d // x, page, x, dtype=cd), _meta(blocks, hk, d, page, dtype=cd)
    elif case.layout == "nhd":
        kc = vc = _meta(blocks, page, hk, d, dtype=cd)
    else:
        kc = vc = _meta(blocks, hk, page, d, dtype=cd)
    k = v = None if opts.get("k_none") else _meta(tokens, hk, d, dtype=qd)
    f32 = torch.float32
    return dict(
        q=_meta(tokens, HEADS_Q, d, dtype=qd), k=k, v=v, o=_meta(tokens, HEADS_Q, d, dtype=od), k_cache=kc,
        v_cache=vc, block_table=_meta(batch, 32, dtype=torch.int32), cu=_meta(batch + 1, dtype=torch.int32),
        seq_lens=_meta(batch, dtype=torch.int32),
        alibi=_meta(HEADS_Q, dtype=f32) if opts.get("alibi") else None,
        sinks=_meta(HEADS_Q, dtype=f32) if opts.get("sinks") else None,
        scales=_meta(1, dtype=f32) if case.cache == "fp8" else None,
        out_scale=_meta(1, dtype=f32) if case.out == "fp8" else None,
        lse=_meta(HEADS_Q, tokens, dtype=f32) if opts.get("lse") else None,
    )  # fmt: skip


def _prefix_launches(case: Case, target: Target) -> list[Launch]:
    from paged_kv_offsets import describe_kv_cache
    from prefix_prefill import configs, float16_copies, gluon_launch, launch, plan

    opts = PREFIX_FORMS[case.form]
    t = _prefix_tensors(case, target)
    kc, vc = describe_kv_cache(t["k_cache"], t["v_cache"], case.layout)
    causal, left, right = opts.get("causal", True), opts.get("left", -1), opts.get("right", -1)
    softcap = opts.get("softcap", 0.0)
    with emulated_device(target) as device:
        arch = configs.detect_arch(device)
        form = _softcap_form(softcap, device, t["q"].dtype)
    p = plan.make_problem(t["q"], t["k"], t["v"], t["o"], t["k_cache"], t["v_cache"], kc, vc,
                          t["block_table"], arch=arch, gluon=case.gluon, causal=causal, left=left,
                          right=right, scale=0.1, alibi=t["alibi"] is not None, sinks=t["sinks"] is not None,
                          softcap_form=form, skip_decode=opts.get("skip_decode", False),
                          lse=t["lse"] is not None)  # fmt: skip
    chosen = plan.plan(p)
    record: list = []
    saved = launch._fwd_kernel, gluon_launch._gluon_fwd_kernel, gluon_launch._gluon_split_kernel
    # (a bf16 call over an fp8 cache first copies q/k/v to float16: an elementwise kernel the matrix
    # leaves out, recorded nowhere, so the case's one launch is the attention kernel's)
    saved_copies = float16_copies._COPIES.jit_fn
    float16_copies._COPIES.jit_fn = _Recorder(saved_copies, [])
    launch._fwd_kernel = _Recorder(saved[0], record)
    gluon_launch._gluon_fwd_kernel = _Recorder(saved[1], record) if saved[1] is not None else None
    gluon_launch._gluon_split_kernel = _Recorder(saved[2], record) if saved[2] is not None else None
    # (meta tensors have no device to count multiprocessors on: the target's, and per-key reads afresh)
    saved_mp = gluon_launch._multiprocessors, gluon_launch._KEY_HEADS
    gluon_launch._multiprocessors = lambda index: MULTIPROCESSORS.get(target.name, 132)
    gluon_launch._KEY_HEADS = {}
    try:
        max_q = 4 if opts.get("short") else 96
        launch.forward(t["q"], t["k"], t["v"], t["o"], t["k_cache"], t["v_cache"], kc, vc, t["block_table"],
                       t["cu"], t["seq_lens"], max_q, causal=causal, window=(left, right), softmax_scale=0.1,
                       alibi_slopes=t["alibi"], sinks=t["sinks"], k_scale=t["scales"], v_scale=t["scales"],
                       out_scale=t["out_scale"], skip_decode=opts.get("skip_decode", False), softcap=softcap,
                       lse=t["lse"], plan_override=chosen)  # fmt: skip
    finally:
        launch._fwd_kernel, gluon_launch._gluon_fwd_kernel, gluon_launch._gluon_split_kernel = saved
        float16_copies._COPIES.jit_fn = saved_copies
        gluon_launch._multiprocessors, gluon_launch._KEY_HEADS = saved_mp
    if chosen.kernel == "triton":  # the ptxas flag the launcher adds on a GPU of this target (not on meta)
        from prefill_runtime import ptxas_launch_options

        with emulated_device(target) as device:
            extra = ptxas_launch_options(chosen.opts().get("register_usage_level", 0), device)
        record = [(k, g, a, {**kw, **extra}) for k, g, a, kw in record]
    return [Launch(*r, chosen) for r in _with_tile_counters(record)]


def _window_launches(case: Case, target: Target) -> list[Launch]:
    from window_prefill import configs, launch
    from window_prefill.plan import plan

    opts = WINDOW_FORMS[case.form]
    dt = DTYPES[case.dtype]
    d, tokens = case.head, 64
    rows = 2**31 // (HEADS_KV * d) + 1 if case.wide else tokens  # k/v past 2**31 elements
    od = _fp8(target) if case.out == "fp8" else dt
    q, o = _meta(tokens, HEADS_Q, d, dtype=dt), _meta(tokens, HEADS_Q, d, dtype=od)
    out_scale = _meta(1, dtype=torch.float32) if case.out == "fp8" else None
    k, v = _meta(rows, HEADS_KV, d, dtype=dt), _meta(rows, HEADS_KV, d, dtype=dt)
    starts = _meta(3, dtype=torch.int32)
    lens = _meta(2, dtype=torch.int32) if opts.get("lens") else None
    sinks = _meta(HEADS_Q, dtype=torch.float32) if opts.get("sinks") else None
    alibi = _meta(HEADS_Q, dtype=torch.float32) if opts.get("alibi") else None
    lse = _meta(HEADS_Q, tokens, dtype=torch.float32) if opts.get("lse") else None
    causal, left, right = opts.get("causal", True), opts.get("left", -1), opts.get("right", -1)
    softcap = opts.get("softcap", 0.0)
    max_len = 4096 if opts.get("wide_window") else 32
    with emulated_device(target) as device:
        arch = configs.detect_arch(device)
        form = _softcap_form(softcap, device, q.dtype)
        p = launch.describe(q, k, v, lens, causal=causal, window_left=left, window_right=right,
                            softmax_scale=0.1, sinks=sinks, bias_key0=opts.get("sinks") == "bias_key0",
                            softcap=softcap, return_lse=lse is not None, alibi_slopes=alibi,
                            out_dtype=od)  # fmt: skip
    p = dataclasses.replace(p, arch=arch, softcap=form, gluon=case.gluon)
    chosen = plan(p)
    record: list = []
    saved = launch._fwd_kernel, launch._gluon_fwd_kernel
    launch._fwd_kernel = _Recorder(saved[0], record)
    launch._gluon_fwd_kernel = _Recorder(saved[1], record) if saved[1] is not None else None
    try:
        launch.run(chosen, q, k, v, o, starts if lens is None else starts[:2], lens, max_len, 2,
                   window_left=left, window_right=right, softmax_scale=0.1, sinks=sinks, softcap=softcap,
                   lse=lse, alibi_slopes=alibi, out_scale=out_scale)  # fmt: skip
    finally:
        launch._fwd_kernel, launch._gluon_fwd_kernel = saved
    return [Launch(*r, chosen) for r in _with_tile_counters(record)]


def _with_tile_counters(record: list) -> list:
    """``record`` with a stand-in tile counter in each persistent launch (``tile_counter`` makes one on
    CUDA only)."""
    for _kernel, _grid, _args, kwargs in record:
        if kwargs.get("PERSISTENT") and kwargs.get("TileCounter") is None:
            kwargs["TileCounter"] = _meta(2, dtype=torch.int32)
    return record


def launches(case: Case) -> list[Launch]:
    """The launches the package's launcher makes for ``case`` under its plan (one; a Gluon plan that
    failed to record would show as a Triton launch and is an error here)."""
    target = TARGETS[case.target]
    got = (_prefix_launches if case.package == "prefix" else _window_launches)(case, target)
    if len(got) != 1:
        raise RuntimeError(f"{case.label()}: {len(got)} launches recorded, expected 1")
    kernel, planned = got[0].kernel.__name__, got[0].plan.kernel
    expected = {"triton": "_fwd_kernel", "gluon": "_gluon_fwd_kernel", "gluon-nhd": "_gluon_fwd_kernel",
                "gluon-hnd": "_gluon_fwd_kernel", "gluon-split": "_gluon_split_kernel"}[planned]  # fmt: skip
    if kernel != expected:
        raise RuntimeError(f"{case.label()}: plan {planned!r} but {kernel} was launched")
    return got


def gluon_offered(package: str) -> tuple[bool, str]:
    """``(offered, why)``: does ``package``'s launcher let its plan pick its Gluon kernel(s) in this
    process (the ``gluon`` input it gives the plan on an sm90 GPU)? Both packages ask
    ``prefill_runtime.gluon_supported`` (the Triton allowlist, ``PREFILL_GLUON``) and their own switch
    (``PREFIX_PREFILL_GLUON``, ``WINDOW_PREFILL_GLUON``)."""
    from prefill_runtime import gluon_supported

    if package == "prefix":
        from prefix_prefill import launch

        return launch.gluon_allowed(), gluon_supported()[1]
    from window_prefill import launch

    return launch.gluon_offered(), gluon_supported()[1]


def prepare_process() -> None:
    """Settings every process that plans or compiles the matrix needs: the compiled kernels (not the
    interpreter's), the Gluon kernels' full form launched directly (no compile tiers)."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise RuntimeError("the compile check needs TRITON_INTERPRET unset (compiled kernels)")
    os.environ["PREFIX_PREFILL_GLUON_TIERED"] = "0"


def kernel_label(launch: Launch) -> str:
    """``package:kernel`` of a launch, e.g. ``prefix:triton``, ``window:gluon``."""
    module = launch.kernel.fn.__module__.split(".")[0]
    return f"{module.split('_')[0]}:{launch.plan.kernel}"


def key_constexprs(launch: Launch) -> str:
    """The constexprs that set a launch's resources, short (tiles, head, layout hints, options)."""
    c = launch.plan.consts()
    keep = [k for k in c if isinstance(c[k], (bool, int)) and not (isinstance(c[k], bool) and not c[k])]
    short = {"QUERIES_PER_KV", "FP8_OUT_MAX"}
    return " ".join(f"{k}={int(c[k]) if isinstance(c[k], bool) else c[k]}" for k in keep if k not in short)
