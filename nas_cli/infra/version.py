"""Which nas-run made a run: its package version and, run from a git checkout, the commit and
whether the checkout had changes. Every run records it (W&B config, summary.json) and
``nas-report`` shows it, so that runs made before and after a change to a scheme are told apart.

W&B's own git capture stays off (``WANDB_DISABLE_GIT``): it records the repository of the
directory a run starts in, which is the user's project, not nas-run.
"""
from __future__ import annotations

import functools
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

DISTRIBUTION = "nas-run"


def package_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # imported from a source tree that was never installed
        return "unknown"


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def code_version() -> dict[str, Any]:
    """``{"version", "commit", "dirty"}``: imported from the ``nas_cli`` folder of a git checkout's top
    level (an editable install, a source tree), the checkout's commit and whether tracked files have
    changes; installed (a wheel), the commit its build recorded (``_build.json``, written by setup.py);
    else None for both (a build outside a checkout). A wheel installed inside some other repository (a
    virtual environment in a checkout) reports its build's commit, never that repository's."""
    package = Path(__file__).resolve().parents[1]
    root = package.parent
    top = _git(root, "rev-parse", "--show-toplevel")
    if top and Path(top).resolve() == root:
        commit = _git(root, "rev-parse", "HEAD")
        status = _git(root, "status", "--porcelain", "--untracked-files=no")
        return {"version": package_version(), "commit": commit, "dirty": None if status is None else bool(status)}
    built = _built(package)
    return {"version": package_version(), "commit": built.get("commit"), "dirty": built.get("dirty")}


def _built(package: Path) -> dict[str, Any]:
    """What the build recorded (setup.py's ``_build.json``), or {} without one."""
    import json

    try:
        data = json.loads((package / "_build.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def describe(code: dict[str, Any] | None) -> str:
    """'0.1.0', '0.1.0+3f2a9c1', '0.1.0+3f2a9c1.dirty' (a run's code in one word); '?' if unknown."""
    if not code:
        return "?"
    text = str(code.get("version") or "?")
    if code.get("commit"):
        text += f"+{str(code['commit'])[:7]}" + (".dirty" if code.get("dirty") else "")
    return text
