"""The README tells the truth: every version and requirement in it (and in each package README) is the
package's own, its results block is what ``bench/readme_results.py`` builds from the folder it names,
its links, the nox sessions and the tests it cites exist, and its CPU examples run.

Its GPU examples run in ``bash bench/gpu_session.sh readme``; its install commands run in CI (``nox -s
demo`` on a CPU machine installs the packages with ``pip install --find-links dist``, ``tests-cpu``
installs them from their local paths) and, one package per fresh venv, in ``nox -s packaging``.
"""

from __future__ import annotations

import fnmatch
import importlib
import inspect
import linecache
import os
import pkgutil
import re
from pathlib import Path

import pytest
from conftest import ON_GPU, bench_module
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PACKAGES = ["paged-kv-offsets", "prefill-runtime", "prefix-prefill", "window-prefill", "attn-reference"]
NAMES = "|".join(re.escape(p) for p in PACKAGES)


def _version(pkg: str) -> str:
    module = pkg.replace("-", "_")
    text = (ROOT / "packages" / pkg / "src" / module / "__init__.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


def _pyproject(pkg: str) -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "packages" / pkg / "pyproject.toml").read_text())["project"]


def _deps(pkg: str) -> list[str]:
    return _pyproject(pkg)["dependencies"]


def _docs() -> list[Path]:
    return [README, *(ROOT / "packages" / p / "README.md" for p in PACKAGES)]


def test_readme_is_short():
    """Room for what a newcomer needs first (install per machine, a CPU quick start with what
    ``validate=True`` catches, a GPU example) beside the package table, support matrix, results, vLLM
    and guarantees, with a few lines to spare for new options and guarantees; the details are in the
    package READMEs."""
    assert len(README.read_text().splitlines()) <= 290


def test_package_table_rows_match_the_packages():
    text = README.read_text()
    for pkg in PACKAGES:
        row = re.search(rf"^\| \[`{pkg}`\]\(packages/{pkg}\) (\S+) \|.*$", text, re.M)
        assert row, f"README has no package-table row for {pkg}"
        assert row.group(1) == _version(pkg), (pkg, row.group(1), _version(pkg))
        depends = row.group(0).rsplit("|", 2)[1]
        specs = re.findall(r"`([a-z][a-z0-9-]*(?:[<>=!~]=?[0-9][^`]*)?)`", depends)
        assert sorted(specs) == sorted(_deps(pkg)), (pkg, specs, _deps(pkg))


@pytest.mark.parametrize("doc", _docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_version_mentioned_is_true(doc):
    """``name 1.2.3``, ``name (1.2.3)``, ``name[cpu] 1.2.3`` and ``Version 1.2.3`` (in a package's own
    README) name the package's current version; every requirement spec of a sibling (``name>=a,<b``)
    is one a pyproject declares, and it admits the sibling's current version."""
    text = doc.read_text()
    for name, ver in re.findall(rf"\b({NAMES})`?(?:\[cpu\])?`?\)? \(?v?(\d+\.\d+\.\d+)\b", text):
        assert ver == _version(name), (doc.name, name, ver)
    if doc.parent.parent.name == "packages":
        own = doc.parent.name
        mentioned = re.findall(r"^Version (\d+\.\d+\.\d+)\.", text, re.M)
        assert mentioned == [_version(own)], (own, mentioned)
        required = re.search(r"^Version \S+ Requires (.*?)(?:; extra|\.$)", text, re.M | re.S)
        assert required, own
        specs = re.findall(r"`([^`]+)`", required.group(1))
        assert sorted(specs) == sorted(_deps(own)), (own, specs)
    declared = {str(Requirement(d)) for p in PACKAGES for d in _deps(p)}
    noxfile = (ROOT / "noxfile.py").read_text()
    for spec in re.findall(rf"`((?:{NAMES}|triton|torch)[<>=][^`]*)`", text):
        if re.fullmatch(r"(torch|triton)==[\d.]+", spec):  # the CPU sessions' pins
            assert f'"{spec}"' in noxfile, (doc.name, spec)
            continue
        assert str(Requirement(spec)) in declared, (doc.name, spec)
        req = Requirement(spec)
        if req.name in PACKAGES:
            assert Version(_version(req.name)) in req.specifier, (doc.name, spec, _version(req.name))


def test_triton_versions_mentioned_are_in_the_declared_range():
    ranges = {str(Requirement(d).specifier) for p in PACKAGES for d in _deps(p) if d.startswith("triton")}
    assert ranges == {"<3.9,>=3.6"}, ranges  # one range for every triton-using package
    spec = Requirement("triton" + ranges.pop()).specifier
    for doc in _docs():
        for ver in re.findall(r"\b[Tt]riton (\d+\.\d+(?:\.\d+)?)\b", doc.read_text()):
            assert Version(ver) in spec, (doc.name, ver)


def test_cpu_extras_declared():
    for pkg in PACKAGES:
        extras = _pyproject(pkg).get("optional-dependencies", {})
        if pkg == "attn-reference":
            assert not any(d.startswith("triton") for d in _deps(pkg))
        else:
            assert extras.get("cpu") == ["numpy"], (pkg, extras)


def test_results_block_is_generated_from_its_folder():
    mod = bench_module("readme_results")
    text = README.read_text()
    folder = mod.readme_folder(text)
    assert folder.is_dir(), folder
    start = mod.BEGIN.search(text).start()
    end = text.index(mod.END, start) + len(mod.END)
    assert text[start:end] == mod.block(folder), "run: python bench/readme_results.py <folder> --write"

    # the newest folder with both main benchmarks (a run of tests only, or of variants such as the
    # --quick benchmarks' *_quick files, does not replace the table)
    def main_run(p, stem):
        return any(re.fullmatch(rf"{stem}(_[0-9a-f]{{7,}})?", f.stem) for f in p.glob(f"{stem}*.csv"))

    full = [
        p.name
        for p in folder.parent.iterdir()
        if p.is_dir() and main_run(p, "window_prefill") and main_run(p, "prefix_prefill")
    ]
    newest = max(full, key=lambda name: name[:10])
    assert folder.name[:10] == newest[:10], f"the README shows {folder.name}; newer benchmarks: {newest}"


def test_links_and_cited_tests_exist():
    for doc in _docs():
        text = doc.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "#")):
                continue
            assert (doc.parent / target).exists(), (doc.name, target)
    text = README.read_text()
    for cell in re.findall(r"`(tests/[^`]+\.py(?:::[\w\[\]-]+)?)`((?:, `::[\w]+`)*)", text):
        path, _, name = cell[0].partition("::")
        source = (ROOT / path).read_text()
        for test in [name, *re.findall(r"`::(\w+)`", cell[1])]:
            if test:
                assert re.search(rf"^(async )?def {re.escape(test)}\(", source, re.M), (path, test)


def test_nox_sessions_named_exist():
    noxfile = (ROOT / "noxfile.py").read_text()
    sessions = set(re.findall(r'@nox\.session\(name="([\w-]+)"', noxfile))
    sessions |= {m.replace("_", "-") for m in re.findall(r"^def (\w+)\(session", noxfile, re.M)}
    for doc in _docs():
        for line in re.findall(r"nox -s ([\w -]+)", doc.read_text()):
            for name in line.split():
                if name in ("&&", "--") or name.startswith("-"):
                    break
                assert name in sessions, (doc.name, name)


MODULES = [p.replace("-", "_") for p in PACKAGES]
# Names of other projects that the docs cite (vLLM, FlashAttention, Triton), checked by no import here
OTHERS = {"chunked_prefill_paged_decode", "return_softmax_lse", "ptx_options"}


def _known_names() -> set[str]:
    """Every name the packages define: modules, module attributes, class attributes, the parameters of
    their functions and kernels, and the string values of their constant tuples and tables."""
    import torch

    known = set(MODULES)
    for top in MODULES:
        names = [
            top,
            *(m.name for m in pkgutil.walk_packages(importlib.import_module(top).__path__, f"{top}.")),
        ]
        for name in names:
            known.add(name.rpartition(".")[2])
            for attr, obj in vars(importlib.import_module(name)).items():
                known.add(attr)
                fn = getattr(obj, "fn", obj)  # a @triton.jit kernel's Python function
                if callable(fn):
                    try:
                        known.update(inspect.signature(fn).parameters)
                    except (TypeError, ValueError):
                        pass
                if inspect.isclass(obj):
                    known.update(dir(obj))
                if isinstance(obj, (tuple, frozenset, set, list, dict)):
                    known.update(x for x in obj if isinstance(x, str))
    return known | OTHERS | {n for n in dir(torch) if not n.startswith("_")}


def _inline_code(text: str) -> list[str]:
    """The `backticked` spans of ``text`` outside fenced blocks (those run, or are shell commands)."""
    return re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```$", "", text, flags=re.M | re.S))


def _resolves(dotted: str) -> bool:
    """Whether ``a.b.c`` names a module, or an attribute (chain) of the longest module prefix."""
    parts = dotted.split(".")
    obj, depth = importlib.import_module(parts[0]), 1
    while depth < len(parts):
        try:
            obj = importlib.import_module(".".join(parts[: depth + 1]))
        except ImportError:
            break
        depth += 1
    for part in parts[depth:]:
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


@pytest.mark.parametrize("doc", _docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_names_mentioned_exist(doc):
    """Each `package.name` cited resolves by import and attribute lookup, and each backticked
    snake_case name (``name``, ``name(...)``, ``name=...``, ``name_*``) is one the packages define (or
    a torch name, or one of ``OTHERS``), with its keyword arguments, and each cited repository path
    exists: a removed function, argument or script does not linger in the docs."""
    import torch

    known = _known_names()
    for span in _inline_code(doc.read_text()):
        for dotted in re.findall(rf"(?<![\w.])((?:{'|'.join(MODULES)})(?:\.\w+)+)", span):
            assert _resolves(dotted), (doc.name, dotted)
        for path in re.findall(r"^((?:bench|tests|packages)/[\w./-]+?)(?:::\w+)?$", span):
            assert (ROOT / path).exists(), (doc.name, path)
        for ns, name in re.findall(r"torch\.ops\.(\w+)\.(\w+)", span):
            importlib.import_module(ns)
            assert hasattr(getattr(torch.ops, ns), name), (doc.name, span)
        m = re.fullmatch(r"([a-z_][a-z0-9_]*\*?)(\(.*\))?(=.*)?", span)
        if m and ("_" in m.group(1) or m.group(2)):
            assert any(fnmatch.fnmatchcase(k, m.group(1)) for k in known), (doc.name, span)
            for keyword in re.findall(r"\b([a-z_]\w*)=(?!=)", m.group(2) or ""):
                assert keyword in known, (doc.name, span, keyword)


# Words that mean something only inside this project's work log
INTERNAL = re.compile(r"NOTES entry|\bentry \d+|\bissue \d+|\blent\b|\bwindow PR\b|\bround \d+", re.I)


@pytest.mark.parametrize("doc", _docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_internal_terms(doc):
    found = INTERNAL.findall(doc.read_text())
    assert not found, (doc.name, found)


@pytest.mark.skipif(ON_GPU, reason="bash bench/gpu_session.sh readme runs every example on the GPU")
@pytest.mark.parametrize("doc", _docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_cpu_examples_run(doc, capsys):
    """Every ```python block of the doc that names no cuda device, under the interpreter, in this process
    (fresh globals each, the environment restored after; ``bench/readme_examples.py --cpu`` runs the
    same blocks in fresh interpreters): it raises nothing, prints no failed comparison, and prints each
    error message that a ``print(e)  # message`` line shows."""
    examples = bench_module("readme_examples")
    for line, code in examples.python_blocks(doc.read_text()):
        if "cuda" in code:
            continue
        name = f"<{doc.relative_to(ROOT)}:{line}>"
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)  # (@triton.jit reads it)
        saved = dict(os.environ)
        try:
            exec(compile(code, name, "exec"), {"__name__": "__main__"})
        finally:
            os.environ.clear()
            os.environ.update(saved)
            linecache.cache.pop(name, None)
        out = capsys.readouterr().out
        assert not examples.FAILED_COMPARISON.search(out), (name, out)
        for error in re.findall(r"^\s*print\(e\)  # (.+)$", code, re.M):  # an error the example shows
            assert error in out, (name, error, out)
