"""The ``vllm.general_plugins`` entry points swap vLLM's Triton prefill kernels for ours.

vLLM itself is not installed here: the tests import the stand-in ``vllm`` package that
``../shared/peers/get-vllm-kernels.sh`` builds (vLLM 0.33's two kernel modules with small stubs), from
``.peers`` in the repository or, where that is missing (CI), from a temporary directory the script
fills (skipped with the reason if that fails, e.g. without network; pip's own network timeouts bound
it, the test sets no wall-clock limit). A fake
``vllm.v1.attention.ops.chunked_prefill_paged_decode`` (and a fake user of the varlen kernel) imports
vLLM's function by name *before* the plugin runs, as vLLM's backends do. Every test starts from no
``vllm`` module imported and restores ``sys.modules``/``sys.path`` afterwards.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import DEVICE, poison
from it_cases import Dense, Paged, dense_case, paged_case

import prefix_prefill.launch as pp_iface
import window_prefill.launch as wp_iface
from attn_reference import compare
from prefix_prefill import vllm_plugin as pp_plugin
from window_prefill import vllm_plugin as wp_plugin

ROOT = Path(__file__).resolve().parents[2]
PP_MODULE = "vllm.v1.attention.ops.prefix_prefill"
WP_MODULE = "vllm.v1.attention.ops.triton_prefill_attention"
PP_USER = "vllm.v1.attention.ops.chunked_prefill_paged_decode"  # imports PP_MODULE's function by name
WP_USER = "vllm.v1.attention.ops.fake_varlen_user"  # imports WP_MODULE's function by name
# vLLM's own kernels (run here for a cross-check) compute inf - inf on masked lanes under the interpreter.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")


def _has_peers(d: Path) -> bool:
    return (d / "vllm/v1/attention/ops/prefix_prefill.py").is_file() and (
        d / "vllm/v1/attention/ops/triton_prefill_attention.py"
    ).is_file()


@pytest.fixture(scope="session")
def peers_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    local = ROOT / ".peers"
    if _has_peers(local):
        return local
    script = ROOT.parent / "shared" / "peers" / "get-vllm-kernels.sh"
    if not script.is_file():
        pytest.skip(f"no .peers and no {script} to build the stand-in vLLM package")
    dest = tmp_path_factory.mktemp("peers")
    try:
        subprocess.run(
            ["bash", str(script), str(dest)],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        )
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", "") or ""
        pytest.skip(f"could not build the stand-in vLLM package (pip without network?): {e} {detail[-300:]}")
    if not _has_peers(dest):
        pytest.skip(f"{script} ran but left no vLLM kernels in {dest}")
    return dest


def _vllm_names() -> list[str]:
    return [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]


@pytest.fixture
def vllm_env(peers_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The stand-in vLLM importable and freshly imported, plugin state reset; all undone afterwards."""
    saved = {n: sys.modules.pop(n) for n in _vllm_names()}
    sys.path.insert(0, str(peers_dir))
    monkeypatch.setattr(pp_plugin, "_state", {})
    monkeypatch.setattr(wp_plugin, "_state", {})
    monkeypatch.delenv(pp_plugin.ENV_VAR, raising=False)
    try:
        yield peers_dir
    finally:
        for n in _vllm_names():
            del sys.modules[n]
        sys.modules.update(saved)
        sys.path.remove(str(peers_dir))


def _fake_user(name: str, source_module: str) -> types.ModuleType:
    """A vLLM module that did ``from <source_module> import context_attention_fwd`` at import."""
    mod = types.ModuleType(name)
    exec(f"from {source_module} import context_attention_fwd", mod.__dict__)
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    setattr(importlib.import_module(parent), child, mod)
    return mod


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
    user = _fake_user(PP_USER, PP_MODULE)
    target = importlib.import_module(PP_MODULE)
    original = target.context_attention_fwd
    assert user.context_attention_fwd is original
    vllm_out, p = _run_prefix(original)  # vLLM's own kernel, for the drop-in cross-check
    monkeypatch.setenv(pp_plugin.ENV_VAR, "1")
    caplog.set_level(logging.INFO, logger=pp_plugin.LOGGER_NAME)
    pp_plugin.register()
    assert target.context_attention_fwd is pp_plugin.context_attention_fwd
    assert user.context_attention_fwd is pp_plugin.context_attention_fwd
    assert not [n for n in _vllm_names() if vars(sys.modules[n]).get("context_attention_fwd") is original]
    records = [r for r in caplog.records if r.name == pp_plugin.LOGGER_NAME]
    assert len(records) == 1 and records[0].levelno == logging.INFO
    assert PP_USER in records[0].getMessage() and PP_MODULE in records[0].getMessage()

    pp_count, wp_count = _count_our_launches(monkeypatch)
    out, _ = _run_prefix(sys.modules[PP_USER].context_attention_fwd, p)  # vLLM's call path
    assert pp_count.launches == 1 and wp_count.launches == 0
    res = compare(out, p.reference())
    assert res, res
    torch.testing.assert_close(out, vllm_out, atol=2e-2, rtol=2e-2)  # same answer as vLLM's kernel


def test_varlen_plugin_replaces_and_rebinds(vllm_env, monkeypatch, caplog):
    user = _fake_user(WP_USER, WP_MODULE)
    target = importlib.import_module(WP_MODULE)
    original = target.context_attention_fwd
    vllm_out, p = _run_varlen(original)
    monkeypatch.setenv(wp_plugin.ENV_VAR, "1")
    caplog.set_level(logging.INFO, logger=wp_plugin.LOGGER_NAME)
    wp_plugin.register()
    assert target.context_attention_fwd is wp_plugin.context_attention_fwd
    assert user.context_attention_fwd is wp_plugin.context_attention_fwd
    records = [r for r in caplog.records if r.name == wp_plugin.LOGGER_NAME]
    assert len(records) == 1 and WP_USER in records[0].getMessage()

    pp_count, wp_count = _count_our_launches(monkeypatch)
    out, _ = _run_varlen(sys.modules[WP_USER].context_attention_fwd, p)
    assert wp_count.launches == 1 and pp_count.launches == 0
    res = compare(out, p.reference())
    assert res, res
    torch.testing.assert_close(out, vllm_out, atol=2e-2, rtol=2e-2)


def test_register_twice_is_harmless(vllm_env, monkeypatch, caplog):
    user = _fake_user(PP_USER, PP_MODULE)
    monkeypatch.setenv(pp_plugin.ENV_VAR, "1")
    caplog.set_level(logging.INFO)
    for _ in range(3):
        pp_plugin.register()
        wp_plugin.register()
    assert user.context_attention_fwd is pp_plugin.context_attention_fwd
    assert sys.modules[PP_MODULE].context_attention_fwd is pp_plugin.context_attention_fwd
    assert sys.modules[WP_MODULE].context_attention_fwd is wp_plugin.context_attention_fwd
    assert pp_plugin._state["original"] is not pp_plugin.context_attention_fwd  # vLLM's, not ours
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
    assert _vllm_names() == [], "a disabled plugin must not import vLLM"
    user = _fake_user(PP_USER, PP_MODULE)
    original = sys.modules[PP_MODULE].context_attention_fwd
    pp_plugin.register()
    wp_plugin.register()
    assert original is not pp_plugin.context_attention_fwd
    assert user.context_attention_fwd is original
    assert sys.modules[PP_MODULE].context_attention_fwd is original
    assert pp_plugin._state == {} and wp_plugin._state == {}
    # negative control of the launch counter: vLLM's path now runs vLLM's kernel, not ours
    pp_count, wp_count = _count_our_launches(monkeypatch)
    out, p = _run_prefix(user.context_attention_fwd)
    assert pp_count.launches == 0 and wp_count.launches == 0
    res = compare(out, p.reference())
    assert res, res


def test_without_vllm_does_nothing(monkeypatch):
    saved = {n: sys.modules.pop(n) for n in _vllm_names()}
    try:
        monkeypatch.setenv(pp_plugin.ENV_VAR, "1")
        if importlib.util.find_spec("vllm") is None:  # the usual case: vLLM is not installed
            pp_plugin.register()
            wp_plugin.register()
            assert _vllm_names() == []
        monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` fails
        pp_plugin.register()
        wp_plugin.register()
        assert _vllm_names() == ["vllm"] and sys.modules["vllm"] is None
    finally:
        for n in _vllm_names():
            sys.modules.pop(n, None)
        sys.modules.update(saved)


# ----------------------------------------------------------------------------- wrappers
UNSUPPORTED = [
    ({"is_block_table_ptr": True}, "is_block_table_ptr"),
    ({"interleaved_v_pack_factor": 8}, "interleaved_v_pack_factor=8"),
]


@pytest.mark.parametrize(("kwargs", "needle"), UNSUPPORTED)
def test_unsupported_vllm_options_raise(kwargs, needle):
    p = paged_case(torch.float16, DEVICE)
    o = torch.empty_like(p.q)
    with pytest.raises(NotImplementedError, match=needle) as info:
        pp_plugin.context_attention_fwd(*p.vllm_args(o), **kwargs)
    assert pp_plugin.ENV_VAR in str(info.value)


def test_wrapper_signatures_match_vllm(vllm_env):
    for module, plugin in ((PP_MODULE, pp_plugin), (WP_MODULE, wp_plugin)):
        theirs = inspect.signature(importlib.import_module(module).context_attention_fwd).parameters
        ours = inspect.signature(plugin.context_attention_fwd).parameters
        assert list(ours) == list(theirs), module  # same names in the same positional order
        for name, param in theirs.items():
            assert ours[name].default == param.default, (module, name)
            assert ours[name].kind == param.kind, (module, name)


def test_entry_points_declared():
    tomllib = pytest.importorskip("tomllib")
    for pkg, mod in (("window-prefill", "window_prefill"), ("prefix-prefill", "prefix_prefill")):
        meta = tomllib.loads((ROOT / "packages" / pkg / "pyproject.toml").read_text())
        value = meta["project"]["entry-points"]["vllm.general_plugins"][mod]
        assert value == f"{mod}.vllm_plugin:register"
        module_name, _, attr = value.partition(":")
        assert callable(getattr(importlib.import_module(module_name), attr))


# ----------------------------------------------------------------------------- the log line in vLLM
# A minimal vLLM module tree that sets up logging the way vLLM does: `vllm/logger.py` runs a
# `logging.config.dictConfig` at import that gives the `vllm` logger a stdout handler (INFO) and turns
# its propagation off (nothing reaches the root logger), and `vllm.plugins.load_general_plugins` (which
# imports `vllm.logger` first, as vLLM's does) calls each plugin's `register`. The kernel modules hold
# dummy functions: this is about the log line, not the kernels.
FAKE_VLLM = {
    "vllm/__init__.py": "",
    "vllm/v1/__init__.py": "",
    "vllm/v1/attention/__init__.py": "",
    "vllm/v1/attention/ops/__init__.py": "",
    "vllm/v1/attention/ops/prefix_prefill.py": "def context_attention_fwd(*args, **kwargs):\n    pass\n",
    "vllm/v1/attention/ops/triton_prefill_attention.py": "def context_attention_fwd(*args, **kwargs):\n"
    "    pass\n",
    "vllm/v1/attention/ops/chunked_prefill_paged_decode.py": "from vllm.v1.attention.ops.prefix_prefill "
    "import context_attention_fwd\n",
    "vllm/logger.py": """
import logging
import os
import logging.config
import os

DEFAULT_LOGGING_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"vllm": {"format": "%(levelname)s %(name)s] %(message)s"}},
    "handlers": {"vllm": {"class": "logging.StreamHandler", "formatter": "vllm", "level": "INFO",
                          "stream": "ext://sys.stdout"}},
    "loggers": {"vllm": {"handlers": ["vllm"], "level": os.environ.get("VLLM_LOGGING_LEVEL", "INFO"),
                         "propagate": False}},
}
if os.environ.get("VLLM_CONFIGURE_LOGGING", "1") == "1":
    logging.config.dictConfig(DEFAULT_LOGGING_CONFIG)


def init_logger(name):
    return logging.getLogger(name)
""",
    "vllm/plugins/__init__.py": """
import logging
import os

import vllm.v1.attention.ops.chunked_prefill_paged_decode  # imports vLLM's function by name
from vllm.logger import init_logger

logger = init_logger(__name__)


def load_general_plugins():
    import prefix_prefill.vllm_plugin
    import window_prefill.vllm_plugin

    for register in (prefix_prefill.vllm_plugin.register, window_prefill.vllm_plugin.register):
        register()
    # negative control: a logger outside `vllm` (where the plugins logged before) prints nothing here
    logging.getLogger("prefix_prefill.vllm_plugin").info("CONTROL: not under vllm")
    logger.info("plugins loaded")
""",
}


@pytest.mark.parametrize("with_init_logger", [True, False], ids=["vllm.logger", "no-vllm.logger"])
def test_log_line_shows_under_vllms_logging_setup(tmp_path, with_init_logger):
    """In a process set up as vLLM sets up logging, `load_general_plugins()` with the variable set
    prints each plugin's INFO line on vLLM's handler; no handler of the test's own is attached to
    any logger. Without a `vllm.logger` module (an old tree) the plugins' plain `vllm.`-named logger
    still reaches the `vllm` logger's handler, configured here by `vllm/__init__.py`. (With the
    variable unset nothing is replaced or logged: `test_env_unset_changes_nothing`.)"""
    for rel, text in FAKE_VLLM.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if not with_init_logger:
        (tmp_path / "vllm/__init__.py").write_text(
            FAKE_VLLM["vllm/logger.py"].replace("def init_logger", "def _x")
        )
        (tmp_path / "vllm/logger.py").unlink()
        plugins = tmp_path / "vllm/plugins/__init__.py"
        plugins.write_text(
            plugins.read_text().replace(
                "from vllm.logger import init_logger", "init_logger = logging.getLogger"
            )
        )
    src = [
        str(ROOT / "packages" / p / "src") for p in ("window-prefill", "prefix-prefill", "prefill-runtime")
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update(PYTHONPATH=os.pathsep.join([str(tmp_path), *src, env.get("PYTHONPATH", "")]))
    code = "from vllm.plugins import load_general_plugins; load_general_plugins()"

    env["PREFILL_KERNELS_VLLM"] = "1"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = proc.stdout + proc.stderr
    for plugin, target in ((pp_plugin, PP_MODULE), (wp_plugin, WP_MODULE)):
        lines = [line for line in shown.splitlines() if line.startswith(f"INFO {plugin.LOGGER_NAME}] ")]
        assert len(lines) == 1, shown
        assert f"{target}.context_attention_fwd replaced by" in lines[0], lines
    assert PP_USER in shown, shown  # the rebinding is reported
    assert "INFO vllm.plugins] plugins loaded" in shown, shown  # vLLM's own line, for comparison
    assert "CONTROL" not in shown, shown  # the emulated setup shows only `vllm` loggers' lines
