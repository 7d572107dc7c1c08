"""Sessions: lint, tests-cpu (Triton interpreter), tests-cuda / tests-rocm (GPU), demo, bench, tune,
compile-check, build, packaging, fuzz.

* ``nox -s lint tests-cpu`` is the project's test command (``.ci/run`` runs it, then ``nox -s demo``).
* ``nox -s demo`` needs only Python and pip: with a CUDA/ROCm torch that sees a GPU in the Python
  running nox it uses that (offline, like tests-cuda); otherwise it makes a venv with the CPU torch and
  runs on the Triton interpreter at a small size (``demo-cpu``).
* ``nox -s tests-cpu -- packages/paged-kv-offsets`` tests one package with only its own
  dependencies (plus attn-reference, which every kernel test compares against) installed.
* GPU sessions reuse the Python, torch and triton already installed for that GPU
  (``venv_backend="none"``): they install nothing and put the packages' ``src/`` directories on
  ``PYTHONPATH``, so they also run offline on an image without hatchling. Run them from the
  Python environment that has the GPU build of torch (e.g. ``python -m nox -s tests-cuda``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
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
# The packages declare triton>=3.6,<3.9: 3.6 is what the GPU runs were measured with (and the Triton
# prefill_runtime's Gluon allowlist names), 3.8 what the CPU suite runs.
CPU_TRITON = os.environ.get("CPU_TRITON", "triton==3.8.0")
# triton 3.6's interpreter breaks with numpy >= 2.4 (3.8's works): numpy stays below 2.4 where CPU_TRITON
# pins triton 3.6.
NUMPY = "numpy<2.4" if re.fullmatch(r"triton\s*==\s*3\.6(\.\d+)*", CPU_TRITON.strip()) else "numpy"
TEST_DEPS = ["pytest>=8", "hypothesis>=6", NUMPY, "pytest-xdist>=3.2"]
# Offline compiles for the GPU targets (the tests marked ``compile_check``) take minutes of CPU: they run
# in their own session (compile-check), not in tests-cpu. tests-cpu keeps the three Gluon kernel compiles
# of every form a plan takes (NHD and split prefix, window; about 75 CPU-s): the Gluon kernels never run
# on the CPU, and a Gluon build that breaks sends every GPU call to the Triton kernel without an error.
DIST = ROOT / "dist"
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
    session.run(
        "python", "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider", *_workers(),
        "-m", "not compile_check", *pytest_args,
        env={"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip


def _workers() -> list[str]:
    """xdist's worker flags; work stealing lets an idle worker take queued tests from a busy one, so a
    few long interpreter tests do not leave one core idle at the end."""
    return ["-n", CPU_WORKERS, "--dist", "worksteal"] if CPU_WORKERS not in ("0", "1") else []


def _install_all(session: nox.Session) -> None:
    """The CPU torch, the interpreter's triton, the test tools and every local package."""
    session.install(CPU_TORCH, CPU_TRITON, *TEST_DEPS)
    install: list[str] = []
    for pkg in PACKAGES:
        for dep in [*PACKAGES[pkg][1], pkg]:
            if dep not in install:
                install.append(dep)
    session.install(*install)


@nox.session(name="compile-check")
def compile_check(session: nox.Session) -> None:
    """Portability, shown: every launch the two packages' plans pick (each table entry, head-size class,
    cache layout, dtype class and option) compiled without a GPU by Triton's bundled toolchains for
    sm80, sm90, sm100, gfx942 and gfx950, and held to each target's shared-memory/LDS budget, no
    spills or scratch, and an occupancy floor (tests/compile_check/: the matrix in cc_matrix.py, the
    budgets and rules in cc_targets.py), plus the Gluon kernels' own sm90 compile tests: the tests
    marked ``compile_check``, which tests-cpu leaves out. Files the table (compile-check.md and .csv) under
    bench/results/compile-check/<date>-<commit>/ (``COMPILE_CHECK_OUT`` names another directory).
    Under 10 minutes on 2 cores: the matrix compiles on two worker processes, the rest one at a time;
    no verdict depends on time. The prefix Gluon kernels' spill verdicts bind on the Triton their
    plan offers them on (prefill_runtime's allowlist: ``CPU_TRITON=triton==3.6.0 nox -s
    compile-check``, or only sm90: ``python tests/compile_check/cc_run.py --out DIR --targets sm90``
    under that Triton); on the default 3.8 they are compiled and reported, informational
    (tests/compile_check/cc_targets.py)."""
    _install_all(session)
    out = os.environ.get("COMPILE_CHECK_OUT") or str(_results_dir("compile-check"))
    session.run(
        "python", "-m", "pytest", "tests", "-m", "compile_check", "-q", "-p", "no:cacheprovider",
        *session.posargs,
        env={"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "", "COMPILE_CHECK_OUT": out},
    )  # fmt: skip
    session.log(f"compile-check table: {out}")


def _results_dir(kind: str) -> Path:
    """bench/results/<kind>/<date>-<short commit>[-dirty] (dirty: tracked files changed since the commit)."""
    import datetime

    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", ".", ":!bench/results"], cwd=ROOT)
    name = f"{datetime.date.today().isoformat()}-{sha.stdout.strip() or 'nogit'}"
    return ROOT / "bench" / "results" / kind / (name + ("-dirty" if dirty.returncode else ""))


def _gpu_tests(session: nox.Session) -> None:
    pkgs, pytest_args = _selected(session.posargs)
    tests = [f"tests/{PACKAGES[p][0]}" for p in pkgs] or ["tests"]
    session.run(
        "python", "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider", "-m", "not compile_check",
        *pytest_args, env={"PYTHONPATH": _src_path(), "TRITON_INTERPRET": "0"},
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
    """Benchmarks on the GPU: writes bench/results/<gpu>/<date>-<commit>/ (csv, md, png per kernel and
    the combined table). Args go to both scripts (e.g. ``nox -s bench -- --quick``)."""
    env = {"PYTHONPATH": _src_path()}
    session.run("python", "bench/run_all.py", *session.posargs, env=env, external=True)


def _gpu_torch() -> bool:
    """Whether the Python running nox has a torch that sees a GPU (CUDA, or ROCm exposed as cuda).
    Asked in a child process so that nox itself never imports torch."""
    if importlib.util.find_spec("torch") is None:
        return False
    code = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


@nox.session(venv_backend="none")
def demo(session: nox.Session) -> None:
    """A realistic prefill per kernel, checked against the float64 reference: on the GPU of the Python
    running nox if its torch sees one (``demo-gpu``), else under the Triton interpreter in a venv with
    the CPU torch (``demo-cpu``)."""
    if _gpu_torch():
        session.log(f"{sys.executable} has a torch that sees a GPU: running demo-gpu")
        demo_gpu(session)
    else:
        session.log(f"no GPU torch in {sys.executable}: running demo-cpu (a venv with {CPU_TORCH})")
        session.notify("demo-cpu", session.posargs)


@nox.session(name="demo-gpu", venv_backend="none")
def demo_gpu(session: nox.Session) -> None:
    """The demo on the GPU with the Python's own torch/triton; installs nothing, works offline."""
    env = {"PYTHONPATH": _src_path(), "TRITON_INTERPRET": "0"}
    session.run(sys.executable, "bench/demo.py", *session.posargs, env=env, external=True)


@nox.session(name="demo-cpu")
def demo_cpu(session: nox.Session) -> None:
    """The demo under the Triton interpreter (small sizes) in a venv with the CPU torch and the
    interpreter's triton, the packages installed as the README says (``pip install --find-links dist
    <name>[cpu]``, wheels built into dist/ first when missing) and run from that install."""
    session.install(CPU_TORCH, CPU_TRITON)
    if not _wheels_fresh():
        _build_wheels(session)
    session.install("--find-links", str(DIST), "window-prefill[cpu]", "prefix-prefill[cpu]", "attn-reference")
    # a reused venv may hold an older build of the same version: put these wheels in
    session.install("--no-deps", "--force-reinstall", *(str(_wheel(p)) for p in PACKAGES))
    session.run(
        "python", "bench/demo.py", *session.posargs,
        env={"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "", "BENCH_PACKAGES": "installed"},
    )  # fmt: skip


def _version(pkg: str) -> str:
    """The package's version, as its ``__init__.py`` (hatch's version source) says."""
    module = PACKAGES[pkg][0]
    text = (ROOT / pkg / "src" / module / "__init__.py").read_text()
    found = re.search(r'^__version__ = "([^"]+)"', text, re.M)
    if not found:
        raise RuntimeError(f"no __version__ in {pkg}")
    return found.group(1)


def _wheel(pkg: str) -> Path:
    module = PACKAGES[pkg][0]
    return DIST / f"{module}-{_version(pkg)}-py3-none-any.whl"


def _wheels_fresh() -> bool:
    """Every package has a wheel of its current version in dist/, newer than each file of its tree."""
    for pkg in PACKAGES:
        wheel = _wheel(pkg)
        if not wheel.is_file():
            return False
        files = [f for f in (ROOT / pkg).rglob("*") if f.is_file() and "__pycache__" not in f.parts]
        newest = max(f.stat().st_mtime for f in files)
        if newest > wheel.stat().st_mtime:
            return False
    return True


def _build_wheels(session: nox.Session) -> None:
    """A wheel of every package into dist/ (older wheels of the same packages removed first)."""
    DIST.mkdir(exist_ok=True)
    for pkg, (module, _) in PACKAGES.items():
        for old in DIST.glob(f"{module}-*.whl"):
            old.unlink()
        session.run("python", "-m", "pip", "wheel", "--no-deps", "-q", pkg, "-w", str(DIST))
        if not _wheel(pkg).is_file():
            session.error(f"pip wheel {pkg} did not write {_wheel(pkg).name}")


@nox.session
def build(session: nox.Session) -> None:
    """Wheels of every package into dist/: ``pip install --find-links dist window-prefill`` then
    installs one package with its siblings taken from there."""
    _build_wheels(session)
    session.log("wheels: " + " ".join(sorted(p.name for p in DIST.glob("*.whl"))))


CHECK_INSTALL = """
import importlib, importlib.metadata as md, sys
module, dist, extra = sys.argv[1:4]
m = importlib.import_module(module)
assert md.version(dist) == m.__version__, (md.version(dist), m.__version__)
names = sorted(d.metadata["Name"].lower().replace("_", "-") for d in md.distributions())
print(m.__name__, m.__version__, "installed:", " ".join(names))
if module == "attn_reference":
    assert "triton" not in names and "triton" not in sys.modules, "attn-reference brought triton"
else:
    import triton
    assert "numpy" in names or extra != "cpu", "the [cpu] extra did not bring numpy"
    print("triton", triton.__version__)
"""


@nox.session(reuse_venv=False)
@nox.parametrize("package", list(PACKAGES))
def packaging(session: nox.Session, package: str) -> None:
    """Per package, in a fresh venv: the CPU torch first, then ``pip install --find-links dist <name>``
    (the triton-using ones with their ``[cpu]`` extra) must resolve the siblings from dist/ (built
    here if its wheels are missing or stale) and bring only the declared dependencies (attn-reference no
    triton); the package imports and reports the installed version."""
    if not _wheels_fresh():
        _build_wheels(session)
    session.install(CPU_TORCH)
    name = package.removeprefix("packages/")
    extra = "" if name == "attn-reference" else "cpu"
    session.install("--find-links", str(DIST), f"{name}[{extra}]" if extra else name)
    # Outside the tree, so the installed copy is imported, not packages/*/src.
    session.chdir(session.create_tmp())
    session.run("python", "-c", CHECK_INSTALL, PACKAGES[package][0], name, extra)


@nox.session
def fuzz(session: nox.Session) -> None:
    """Hypothesis fuzzing of both kernels against the reference under the Triton interpreter, 500
    examples per kernel (``tests-cpu`` runs the same tests at 25). Args go to pytest."""
    _install_all(session)
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
