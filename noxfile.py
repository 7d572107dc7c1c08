"""Sessions: lint, tests-cpu (Triton interpreter), tests-cuda / tests-rocm (GPU), bench, demo.

* ``nox -s lint tests-cpu`` is the project's test command (CI runs exactly this).
* ``nox -s tests-cpu -- packages/paged-kv-offsets`` tests one package with only its own
  dependencies (plus attn-reference, which every kernel test compares against) installed.
* GPU sessions reuse the Python, torch and triton already installed for that GPU
  (``venv_backend="none"``): they install nothing and put the packages' ``src/`` directories on
  ``PYTHONPATH``, so they also run offline on an image without hatchling. Run them from the
  Python environment that has the GPU build of torch (e.g. ``python -m nox -s tests-cuda``).
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

ROOT = Path(__file__).parent
PACKAGES = {
    "packages/paged-kv-offsets": ("paged_kv_offsets", []),
    "packages/attn-reference": ("attn_reference", []),
    "packages/prefill-runtime": ("prefill_runtime", []),
    "packages/window-prefill": ("window_prefill", ["packages/prefill-runtime", "packages/attn-reference"]),
    "packages/prefix-prefill": (
        "prefix_prefill",
        ["packages/paged-kv-offsets", "packages/prefill-runtime", "packages/attn-reference"],
    ),
}
# The CPU build of torch that lies on the CI/dev machines' disk; never let a CPU session resolve
# an unpinned torch (that pulls a multi-GB CUDA build).
CPU_TORCH = os.environ.get("CPU_TORCH", "torch==2.13.0")
# triton 3.6's interpreter breaks with numpy >= 2.4; 3.8 works.
CPU_TRITON = os.environ.get("CPU_TRITON", "triton==3.8.0")
TEST_DEPS = ["pytest>=8", "hypothesis>=6", "numpy", "pytest-xdist"]
# tests-cpu spreads the interpreter tests over this many worker processes (pytest-xdist): the CI
# machine has 2 cores, and the interpreter runs one test on one core. PYTEST_WORKERS=0 runs in-process.
CPU_WORKERS = os.environ.get("PYTEST_WORKERS", str(min(4, os.cpu_count() or 1)))

nox.options.sessions = ["lint", "tests-cpu"]
nox.options.reuse_existing_virtualenvs = True


def _src_path() -> str:
    return os.pathsep.join(str(p) for p in sorted(ROOT.glob("packages/*/src")))


def _selected(posargs: list[str]) -> tuple[list[str], list[str]]:
    """Split posargs into package dirs (``packages/<name>``) and extra pytest args."""
    pkgs = [a.rstrip("/") for a in posargs if a.rstrip("/") in PACKAGES]
    rest = [a for a in posargs if a.rstrip("/") not in PACKAGES]
    return pkgs, rest


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole repository."""
    session.install("ruff==0.17.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(name="tests-cpu")
def tests_cpu(session: nox.Session) -> None:
    """All tests under the Triton interpreter on CPU tensors (fp16/fp32; bf16 is GPU-only)."""
    pkgs, pytest_args = _selected(session.posargs)
    session.install(CPU_TORCH, CPU_TRITON, *TEST_DEPS)
    selected = pkgs or list(PACKAGES)
    install: list[str] = []
    for pkg in selected:
        for dep in [*PACKAGES[pkg][1], pkg]:
            if dep not in install:
                install.append(dep)
    # Local paths first so that pip takes paged-kv-offsets from the tree, not from an index.
    session.install(*install)
    tests = [f"tests/{PACKAGES[p][0]}" for p in selected] if pkgs else ["tests"]
    workers = ["-n", CPU_WORKERS] if CPU_WORKERS not in ("0", "1") else []
    session.run(
        "python", "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider", *workers, *pytest_args,
        env={"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip


def _gpu_tests(session: nox.Session) -> None:
    pkgs, pytest_args = _selected(session.posargs)
    tests = [f"tests/{PACKAGES[p][0]}" for p in pkgs] or ["tests"]
    session.run(
        "python", "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider", *pytest_args,
        env={"PYTHONPATH": _src_path(), "TRITON_INTERPRET": "0"},
        external=True,
    )  # fmt: skip


@nox.session(name="tests-cuda", venv_backend="none")
def tests_cuda(session: nox.Session) -> None:
    """The same suite on an NVIDIA GPU, plus GPU-only cases (bf16, fp8, long sequences).

    Reuses the interpreter's own torch/triton (CUDA build); installs nothing.
    """
    _gpu_tests(session)


@nox.session(name="tests-rocm", venv_backend="none")
def tests_rocm(session: nox.Session) -> None:
    """The same suite on an AMD GPU (ROCm build of torch, which exposes it as ``cuda``)."""
    _gpu_tests(session)


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Benchmarks on the GPU: writes bench/results/<gpu>/<date>.{csv,md,png}. Args go to both scripts
    (e.g. ``nox -s bench -- --quick``)."""
    env = {"PYTHONPATH": _src_path()}
    session.run("python", "bench/run_all.py", *session.posargs, env=env, external=True)


@nox.session(venv_backend="none")
def demo(session: nox.Session) -> None:
    """A realistic prefill per kernel, checked against the reference (GPU if present, else the
    interpreter at a small size)."""
    session.run("python", "bench/demo.py", *session.posargs, env={"PYTHONPATH": _src_path()}, external=True)


@nox.session
@nox.parametrize("package", list(PACKAGES))
def packaging(session: nox.Session, package: str) -> None:
    """``pip install packages/<name>`` in a fresh venv installs that package and its declared
    dependencies only (attn-reference must not bring triton); then the package imports."""
    session.install(CPU_TORCH)
    local = [d for d in PACKAGES[package][1] if d != "packages/attn-reference"]
    session.install(*local, package)
    module = PACKAGES[package][0]
    code = (
        "import importlib, importlib.metadata as md, sys;"
        f"m = importlib.import_module('{module}'); print(m.__name__, m.__version__);"
        "names = sorted(d.metadata['Name'].lower() for d in md.distributions());"
        "print('installed:', ' '.join(names));"
        "bad = 'triton' in names or 'triton' in sys.modules;"
        f"sys.exit(1 if '{module}' == 'attn_reference' and bad else 0)"
    )
    session.run("python", "-c", code)


@nox.session
def fuzz(session: nox.Session) -> None:
    """Hypothesis fuzzing of both kernels against the reference under the Triton interpreter, 500
    examples per kernel (``tests-cpu`` runs the same tests at 25). Args go to pytest."""
    session.install(CPU_TORCH, CPU_TRITON, *TEST_DEPS)
    install: list[str] = []
    for pkg in PACKAGES:
        for dep in [*PACKAGES[pkg][1], pkg]:
            if dep not in install:
                install.append(dep)
    session.install(*install)
    session.run(
        "python", "-m", "pytest", "tests/hardening/test_fuzz.py", "-q", "-p", "no:cacheprovider",
        "--hypothesis-show-statistics", *session.posargs,
        env={"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "", "FUZZ_EXAMPLES": "500"},
    )  # fmt: skip


@nox.session(venv_backend="none")
def tune(session: nox.Session) -> None:
    """Opt-in tuner (GPU): times candidate configs for every table key of both kernels and writes
    bench/results/<gpu>/tuned-<date>.json plus proposed table lines to review; never at call time.
    Args go to bench/tune.py (e.g. ``nox -s tune -- --quick --budget-s 300``)."""
    session.run("python", "bench/tune.py", *session.posargs, env={"PYTHONPATH": _src_path()}, external=True)
