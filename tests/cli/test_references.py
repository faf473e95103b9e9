"""No dangling references: every file path, ``nas_cli`` module and config choice that
the code's comments and docstrings, the configs and the docs name exists. (A PAPERS.md under docs/ was cited
in seven source files but never existed; ``task=copy`` was named but was not a choice.)"""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATH = re.compile(r"(?<![\w./-])((?:nas_cli|docs|benchmarks|tests|conf|tasks|hydra_plugins)/[\w./-]*\w"
                  r"\.(?:py|md|yaml|json|png|sh))")
MODULE = re.compile(r"(?<![\w.])(nas_cli(?:\.\w+)+)")
CHOICE = re.compile(r"(?<![\w.+~/])(task|attention|model|trainer|logger|experiment|debug|sweep)=([a-z]\w*)(?![\w=,])")
#: choices the docs name on purpose that are not the package's: the guide's own examples and typos it shows
EXAMPLES = {"attention=uniform", "attention=unifrom", "task=my_pairs", "task=digits", "attention=dnass"}


def _package_dirs() -> dict[str, str]:
    """pyproject's package-dir mapping: {package: folder} (nas_cli.conf -> conf, nas_cli.bench -> benchmarks)."""
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return dict(data["tool"]["setuptools"].get("package-dir", {}))


PACKAGE_DIRS = _package_dirs()


def _files(*folders: str, suffixes=(".py", ".md", ".yaml")):
    for folder in folders:
        for p in (ROOT / folder).rglob("*"):
            if p.suffix in suffixes and "benchmarks/study/" not in p.as_posix():
                yield p


def test_named_files_and_modules_exist():
    bad = []
    for f in [*_files("nas_cli", "tasks", "conf", "docs", "benchmarks", "tests", "hydra_plugins"), ROOT / "README.md"]:
        text = f.read_text(errors="ignore")
        for m in PATH.finditer(text):
            if not (ROOT / m.group(1)).exists():
                bad.append(f"{f.relative_to(ROOT)}: {m.group(1)}")
        for m in MODULE.finditer(text):
            parts = [p for p in m.group(1).split(".") if not p.startswith("__")]
            if parts[1:2] == ["conf"]:  # the configs, shipped as the package nas_cli.conf
                continue
            mapped = PACKAGE_DIRS.get(".".join(parts[:2]))  # nas_cli.bench is the folder benchmarks/
            if mapped:
                parts = [mapped, *parts[2:]]
            if not any((ROOT / Path(*parts[:i])).with_suffix(".py").exists() or (ROOT / Path(*parts[:i]) / "__init__.py").exists()
                       for i in range(len(parts), 1, -1)) and len(parts) > 1:
                bad.append(f"{f.relative_to(ROOT)}: {m.group(1)}")
    assert not bad, "named but missing:\n" + "\n".join(bad)


def test_config_choices_named_in_docs_and_configs_exist():
    groups = {p.name: {q.stem for q in p.glob("*.yaml")} for p in (ROOT / "conf").iterdir() if p.is_dir()}
    # the guide's own config files (my_conf/<group>/<name>.yaml) are choices where it uses them
    guide = set(re.findall(r"my_conf/(\w+)/(\w+)\.yaml", (ROOT / "docs" / "extending.md").read_text()))
    examples = EXAMPLES | {f"{g}={v}" for g, v in guide}
    bad = []
    for f in [*_files("docs", "conf", suffixes=(".md", ".yaml")), ROOT / "README.md"]:
        for m in CHOICE.finditer(f.read_text()):
            group, value = m.groups()
            if value not in groups.get(group, {value}) and f"{group}={value}" not in examples:
                bad.append(f"{f.relative_to(ROOT)}: {group}={value}")
    assert not bad, "not a choice:\n" + "\n".join(bad)
