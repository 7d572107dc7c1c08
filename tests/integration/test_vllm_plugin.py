"""The ``vllm.general_plugins`` entry points swap vLLM's Triton prefill kernels for ours.

vLLM itself is not installed here: the tests import the stand-in ``vllm`` package of
``tests/vllm_standin/tree`` (no vLLM code; it runs from a plain clone). Its kernel modules hold
recording stand-ins of vLLM's two ``context_attention_fwd`` functions (they write the float64
reference), and two of its modules import those functions by name at import, as vLLM's do:
``vllm.v1.attention.ops.chunked_prefill_paged_decode`` (the prefix kernel) and
``vllm.v1.attention.backends.triton_attn`` (the varlen kernel). Every test starts from no ``vllm``
module imported and restores ``sys.modules``/``sys.path`` afterwards. (vLLM 0.33's own files, with
ours swapped in: ``tests/integration/test_vllm_dropin.py``.)
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import DEVICE, poison
from it_cases import Dense, Paged, dense_case, paged_case
from vllm_standin import TREE, imported, vllm_modules

import prefix_prefill
import prefix_prefill.launch as pp_iface
import window_prefill
import window_prefill.launch as wp_iface
from attn_reference import compare
from prefix_prefill import vllm_plugin as pp_plugin
from window_prefill import vllm_plugin as wp_plugin

ROOT = Path(__file__).resolve().parents[2]
PP_MODULE = "vllm.v1.attention.ops.prefix_prefill"
WP_MODULE = "vllm.v1.attention.ops.triton_prefill_attention"
PP_USER = "vllm.v1.attention.ops.chunked_prefill_paged_decode"  # imports PP_MODULE's function by name
WP_USER = "vllm.v1.attention.backends.triton_attn"  # imports WP_MODULE's function by name


@pytest.fixture
def vllm_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The stand-in vLLM importable and freshly imported, plugin state reset; all undone afterwards.
    ``VLLM_CONFIGURE_LOGGING=0``: the stand-in ``vllm.logger`` leaves logging to pytest's capture here
    (``test_log_line_shows_under_vllms_logging_setup`` runs vLLM's setup in a process of its own)."""
    monkeypatch.setattr(pp_plugin, "_state", {})
    monkeypatch.setattr(wp_plugin, "_state", {})
    monkeypatch.delenv(pp_plugin.ENV_VAR, raising=False)
    monkeypatch.setenv("VLLM_CONFIGURE_LOGGING", "0")
    with imported(TREE) as root:
        yield root


class CountingKernel:
    """Wraps a ``@triton.jit`` kernel: counts ``kernel[grid](...)`` launches, then runs them."""

    def __init__(self, real: object) -> None:
        self.real = real
        self.launches = 0

    def __getitem__(self, grid: tuple) -> object:
        def launch(*args: object, **kwargs: object) -> object:
            self.launches += 1
            return self.real[grid](*args, **kwargs)

        return launch


def _count_our_launches(monkeypatch: pytest.MonkeyPatch) -> tuple[CountingKernel, CountingKernel]:
    pp = CountingKernel(pp_iface._fwd_kernel)
    wp = CountingKernel(wp_iface._fwd_kernel)
    monkeypatch.setattr(pp_iface, "_fwd_kernel", pp)
    monkeypatch.setattr(wp_iface, "_fwd_kernel", wp)
    return pp, wp


def _run_prefix(fn: object, p: Paged | None = None) -> tuple[torch.Tensor, Paged]:
    """Call ``fn`` (vLLM's prefix ``context_attention_fwd`` signature) on ``p`` or a new problem."""
    p = p or paged_case(torch.float16, DEVICE, sliding_window=6)
    o = poison(torch.empty_like(p.q))
    fn(*p.vllm_args(o), sliding_window=p.sliding_window)  # type: ignore[operator]
    return o, p


def _run_varlen(fn: object, p: Dense | None = None) -> tuple[torch.Tensor, Dense]:
    """Call ``fn`` (vLLM's varlen ``context_attention_fwd`` signature, positionally) on ``p``."""
    p = p or dense_case(torch.float16, DEVICE)
    o = poison(torch.empty_like(p.q))
    fn(p.q, p.k, p.v, o, p.starts, p.lens, p.max_len, True, None, p.window[0], None, p.sinks)  # type: ignore[operator]
    return o, p


# ----------------------------------------------------------------------------- enabled
def test_prefix_plugin_replaces_and_rebinds(vllm_env, monkeypatch, caplog):
    user = importlib.import_module(PP_USER)  # took the name at import, as vLLM's module does
    target = importlib.import_module(PP_MODULE)
    original = target.context_attention_fwd
    assert user.context_attention_fwd is original
    vllm_out, p = _run_prefix(original)  # the stand-in: the reference, through vLLM's signature
    assert len(target.CALLS) == 1
    monkeypatch.setenv(pp_plugin.ENV_VAR, "1")
    caplog.set_level(logging.INFO, logger=pp_plugin.LOGGER_NAME)
    pp_plugin.register()
    assert target.context_attention_fwd is prefix_prefill.context_attention_fwd
    assert user.context_attention_fwd is prefix_prefill.context_attention_fwd
    assert not [n for n in vllm_modules() if vars(sys.modules[n]).get("context_attention_fwd") is original]
    records = [r for r in caplog.records if r.name == pp_plugin.LOGGER_NAME]
    assert len(records) == 1 and records[0].levelno == logging.INFO
    assert PP_USER in records[0].getMessage() and PP_MODULE in records[0].getMessage()

    pp_count, wp_count = _count_our_launches(monkeypatch)
    out, _ = _run_prefix(user.context_attention_fwd, p)  # vLLM's call path
    assert pp_count.launches == 1 and wp_count.launches == 0
    assert len(target.CALLS) == 1  # the stand-in did not run again
    res = compare(out, p.reference())
    assert res, res
    torch.testing.assert_close(out, vllm_out, atol=2e-2, rtol=2e-2)


def test_varlen_plugin_replaces_and_rebinds(vllm_env, monkeypatch, caplog):
    user = importlib.import_module(WP_USER)
    target = importlib.import_module(WP_MODULE)
    original = target.context_attention_fwd
    assert user.context_attention_fwd is original
    vllm_out, p = _run_varlen(original)
    assert len(target.CALLS) == 1
    monkeypatch.setenv(wp_plugin.ENV_VAR, "1")
    caplog.set_level(logging.INFO, logger=wp_plugin.LOGGER_NAME)
    wp_plugin.register()
    assert target.context_attention_fwd is window_prefill.context_attention_fwd
    assert user.context_attention_fwd is window_prefill.context_attention_fwd
    records = [r for r in caplog.records if r.name == wp_plugin.LOGGER_NAME]
    assert len(records) == 1 and WP_USER in records[0].getMessage()

    pp_count, wp_count = _count_our_launches(monkeypatch)
    out, _ = _run_varlen(user.context_attention_fwd, p)
    assert wp_count.launches == 1 and pp_count.launches == 0
    assert len(target.CALLS) == 1
    res = compare(out, p.reference())
    assert res, res
    torch.testing.assert_close(out, vllm_out, atol=2e-2, rtol=2e-2)


def test_register_twice_is_harmless(vllm_env, monkeypatch, caplog):
    user = importlib.import_module(PP_USER)
    monkeypatch.setenv(pp_plugin.ENV_VAR, "1")
    caplog.set_level(logging.INFO)
    for _ in range(3):
        pp_plugin.register()
        wp_plugin.register()
    assert user.context_attention_fwd is prefix_prefill.context_attention_fwd
    assert sys.modules[PP_MODULE].context_attention_fwd is prefix_prefill.context_attention_fwd
    assert sys.modules[WP_MODULE].context_attention_fwd is window_prefill.context_attention_fwd
    assert pp_plugin._state["original"] is not prefix_prefill.context_attention_fwd  # vLLM's, not ours
    for plugin in (pp_plugin, wp_plugin):
        assert len([r for r in caplog.records if r.name == plugin.LOGGER_NAME]) == 1
    pp_count, _ = _count_our_launches(monkeypatch)
    out, p = _run_prefix(user.context_attention_fwd)
    assert pp_count.launches == 1
    res = compare(out, p.reference())
    assert res, res


# ----------------------------------------------------------------------------- disabled
@pytest.mark.parametrize("value", [None, "0", "true"])
def test_env_unset_changes_nothing(vllm_env, monkeypatch, value):
    if value is not None:
        monkeypatch.setenv(pp_plugin.ENV_VAR, value)
    pp_plugin.register()
    wp_plugin.register()
    assert vllm_modules() == [], "a disabled plugin must not import vLLM"
    user = importlib.import_module(PP_USER)
    target = sys.modules[PP_MODULE]
    original = target.context_attention_fwd
    pp_plugin.register()
    wp_plugin.register()
    assert original is not prefix_prefill.context_attention_fwd
    assert user.context_attention_fwd is original
    assert target.context_attention_fwd is original
    assert pp_plugin._state == {} and wp_plugin._state == {}
    # negative control of the launch counter: vLLM's path now runs vLLM's function (the stand-in), not ours
    pp_count, wp_count = _count_our_launches(monkeypatch)
    out, p = _run_prefix(user.context_attention_fwd)
    assert pp_count.launches == 0 and wp_count.launches == 0
    assert len(target.CALLS) == 1 and target.CALLS[0]["o"] is out
    res = compare(out, p.reference())
    assert res, res


def test_without_vllm_does_nothing(monkeypatch):
    saved = {n: sys.modules.pop(n) for n in vllm_modules()}
    try:
        monkeypatch.setenv(pp_plugin.ENV_VAR, "1")
        if importlib.util.find_spec("vllm") is None:  # the usual case: vLLM is not installed
            pp_plugin.register()
            wp_plugin.register()
            assert vllm_modules() == []
        monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` fails
        pp_plugin.register()
        wp_plugin.register()
        assert vllm_modules() == ["vllm"] and sys.modules["vllm"] is None
    finally:
        for n in vllm_modules():
            sys.modules.pop(n, None)
        sys.modules.update(saved)


# ----------------------------------------------------------------------------- what is installed
def test_plugins_install_the_public_functions():
    """The plugins put the packages' public functions in vLLM's place, whose signatures are vLLM's
    (``tests/integration/test_vllm_dropin.py::test_signatures_are_vllms``)."""
    assert pp_plugin.context_attention_fwd is prefix_prefill.context_attention_fwd
    assert wp_plugin.context_attention_fwd is window_prefill.context_attention_fwd


def test_entry_points_declared():
    tomllib = pytest.importorskip("tomllib")
    for pkg, mod in (("window-prefill", "window_prefill"), ("prefix-prefill", "prefix_prefill")):
        meta = tomllib.loads((ROOT / "packages" / pkg / "pyproject.toml").read_text())
        value = meta["project"]["entry-points"]["vllm.general_plugins"][mod]
        assert value == f"{mod}.vllm_plugin:register"
        module_name, _, attr = value.partition(":")
        assert callable(getattr(importlib.import_module(module_name), attr))


# ----------------------------------------------------------------------------- the log line in vLLM
@pytest.mark.parametrize("with_init_logger", [True, False], ids=["vllm.logger", "no-vllm.logger"])
def test_log_line_shows_under_vllms_logging_setup(tmp_path, with_init_logger):
    """In a process set up as vLLM sets up logging (the stand-in ``vllm.logger`` configures the ``vllm``
    logger at import: a stdout handler, no propagation to the root logger), the stand-in
    ``load_general_plugins()`` with the variable set prints each plugin's INFO line on vLLM's handler; no
    handler of the test's own is attached to any logger. Without a ``vllm.logger`` module (an old tree)
    the plugins' plain ``vllm.``-named logger still reaches the ``vllm`` logger's handler, configured
    here by ``vllm/__init__.py``. (With the variable unset nothing is replaced or logged:
    ``test_env_unset_changes_nothing``.)"""
    tree = Path(shutil.copytree(TREE, tmp_path / "tree", ignore=shutil.ignore_patterns("__pycache__")))
    if not with_init_logger:
        logger_py = tree / "vllm/logger.py"
        (tree / "vllm/__init__.py").write_text(logger_py.read_text().replace("def init_logger", "def _x"))
        logger_py.unlink()
        plugins = tree / "vllm/plugins/__init__.py"
        plugins.write_text(
            plugins.read_text().replace(
                "from vllm.logger import init_logger", "import logging\n\ninit_logger = logging.getLogger"
            )
        )
    src = sorted(str(p) for p in (ROOT / "packages").glob("*/src"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update(PYTHONPATH=os.pathsep.join([str(tree), *src, env.get("PYTHONPATH", "")]))
    code = (
        "import logging; from vllm.plugins import load_general_plugins; load_general_plugins(); "
        # negative control: a logger outside `vllm` prints nothing under vLLM's setup
        "logging.getLogger('prefix_prefill.vllm_plugin').info('CONTROL: not under vllm')"
    )

    env["PREFILL_KERNELS_VLLM"] = "1"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = proc.stdout + proc.stderr
    for plugin, target, user in ((pp_plugin, PP_MODULE, PP_USER), (wp_plugin, WP_MODULE, WP_USER)):
        lines = [line for line in shown.splitlines() if line.startswith(f"INFO {plugin.LOGGER_NAME}] ")]
        assert len(lines) == 1, shown
        assert f"{target}.context_attention_fwd replaced by" in lines[0], lines
        assert user in lines[0], lines  # the rebinding is reported
    assert "INFO vllm.plugins] plugins loaded" in shown, shown  # vLLM's own line, for comparison
    assert "CONTROL" not in shown, shown  # the emulated setup shows only `vllm` loggers' lines
