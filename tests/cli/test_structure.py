"""The shape of the code a maintainer inherits: no state shared through module globals (the one
process object aside), no module over 400 lines and no function over 60."""
from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import pkgutil
import types
from pathlib import Path

import nas_cli

ROOT = Path(__file__).resolve().parents[2]

#: the module-level mutable objects nas-run has, each with the reason it must be one
ALLOWED = {
    "nas_cli.infra.process.PROCESS": "what the signal handlers and the exit must reach: the one stop object",
    "nas_cli.attention.triton_tiles._TUNED": "the autotuned kernels, made once per process (as Triton's own cache)",
    "nas_cli.attention.triton_tiles._KEYS": "the autotuner's keys, one int per case, stable within the process",
    "nas_cli.attention.triton_tiles._PREFIX_KEPT": "the prefix form's tiles, timed once per case and process",
}


def _mutable(value) -> bool:
    if isinstance(value, (dict, list, set, bytearray)):
        return True
    kind = type(value)
    if not kind.__module__.startswith("nas_cli") or isinstance(value, (type, tuple, enum.Enum)):
        return False
    return not (dataclasses.is_dataclass(value) and kind.__dataclass_params__.frozen)


def test_no_module_level_mutable_object_but_the_stop_object_and_kernel_caches():
    found: dict[int, str] = {}
    for info in pkgutil.walk_packages(nas_cli.__path__, "nas_cli."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if name.startswith("__") or isinstance(value, (types.ModuleType, types.FunctionType)):
                continue
            if _mutable(value):
                found.setdefault(id(value), f"{info.name}.{name}")  # where it is first seen
    allowed_ids = {id(getattr(importlib.import_module(path.rsplit(".", 1)[0]), path.rsplit(".", 1)[1]))
                   for path in ALLOWED}
    extra = sorted(path for key, path in found.items() if key not in allowed_ids)
    assert not extra, (f"module-level mutable objects {extra}: hand the state to what needs it, make a constant "
                       "immutable (tuple, frozenset, types.MappingProxyType), or say in ALLOWED why it must be one")


def test_no_module_over_400_lines_and_no_function_over_60():
    long_modules, long_functions = [], []
    for path in sorted((ROOT / "nas_cli").rglob("*.py")):
        source = path.read_text()
        if len(source.splitlines()) > 400:
            long_modules.append(f"{path.relative_to(ROOT)} ({len(source.splitlines())} lines)")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not long_modules and not long_functions, (long_modules, long_functions)


def test_the_package_never_imports_the_benchmark_scripts():
    """benchmarks/ holds scripts run from a checkout; they import the package (nas_cli.bench and the rest), and
    nothing installed imports them back: no package module names benchmarks, and pyproject.toml maps no package
    onto that folder."""
    found = []
    for folder in ("nas_cli", "tasks", "hydra_plugins"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "benchmarks"]
    assert found == []
    assert '"benchmarks"' not in (ROOT / "pyproject.toml").read_text()
    for path in (ROOT / "benchmarks").glob("*.py"):  # what a script takes from nas_cli.bench is in the package
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nas_cli.bench."):
                assert (ROOT / "nas_cli" / "bench" / f"{node.module.split('.')[2]}.py").is_file(), (path, node.module)


def _module_guard(tree: ast.Module) -> set[int]:
    """Line numbers inside ``if __name__ == "__main__":`` blocks (a module run with ``python -m``)."""
    lines: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines


def test_only_the_one_wrapper_ends_a_process():
    """An outcome (refused, failed, stopped) is raised where it is decided (``fail`` raises ``Exit``) and said and
    turned into the exit status in one place, ``nas_cli.errors.exits``, which wraps every command's ``main`` and the
    Hydra job: no ``sys.exit`` or ``raise SystemExit`` elsewhere in the package (a module's ``__main__`` guard aside)."""
    import tomllib

    from nas_cli.errors import exits

    ends = []
    for path in (ROOT / "nas_cli").rglob("*.py"):
        tree = ast.parse(path.read_text())
        guard = _module_guard(tree)
        for node in ast.walk(tree):
            text = ast.unparse(node) if isinstance(node, (ast.Call, ast.Raise)) else ""
            if (text.startswith("sys.exit(") or text.startswith("raise SystemExit(")) and node.lineno not in guard:
                ends.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text}")
    assert ends == ["nas_cli/errors.py:%d: raise SystemExit(outcome.code) from None" % _line_of(exits, "raise SystemExit")]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for name, target in scripts.items():
        module, _, attr = target.partition(":")
        entry = getattr(importlib.import_module(module), attr)
        assert entry.__code__ is exits(lambda: None).__code__, f"{name}'s main is not wrapped by exits"
    from nas_cli.commands import nas_run

    assert nas_run._hydra_entry.__wrapped__.__code__ is exits(lambda: None).__code__  # the job, in any worker


def _line_of(function, words: str) -> int:
    import inspect

    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if words in line)


def test_each_outcome_is_converted_in_one_place():
    """A continued run's bad value becomes a refusal in one function (``as_refusal``), a stop signal its line in one
    context manager (``nas_cli.pipeline.run._stops``)."""
    sources = {p: p.read_text() for p in (ROOT / "nas_cli").rglob("*.py")}
    refusals = [p.name for p, text in sources.items() if "Refused(str(err))" in text]
    assert refusals == ["rundir.py"]
    signals = [p.name for p, text in sources.items() if "except SIGTERMException" in text]
    assert signals == ["run.py"]
