"""The build records which commit of nas-run it was built from: ``nas_cli/_build.json`` in the wheel
(``{"commit", "dirty"}``), so that an installed nas-run (a wheel, ``pip install .``, a git URL) tells
its runs' code apart as a checkout does (nas_cli/infra/version.py). Built outside a git checkout (a
source archive), the file is not written and the runs record no commit. The rest of the package's
metadata is in pyproject.toml."""
import json
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _git(*args: str):
    try:
        out = subprocess.run(["git", "-C", str(HERE), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


class BuildPyWithCommit(build_py):
    """build_py, then the commit the source tree is at (and whether tracked files had changes)."""

    def run(self):
        super().run()
        target = Path(self.build_lib) / "nas_cli" / "_build.json"
        top = _git("rev-parse", "--show-toplevel")
        if not top or Path(top).resolve() != HERE:
            target.unlink(missing_ok=True)  # not a checkout of nas-run: no commit to record
            return
        status = _git("status", "--porcelain", "--untracked-files=no")
        target.write_text(json.dumps({"commit": _git("rev-parse", "HEAD"),
                                      "dirty": None if status is None else bool(status)}) + "\n")


setup(cmdclass={"build_py": BuildPyWithCommit})
