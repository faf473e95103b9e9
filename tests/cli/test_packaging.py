"""The package installs anywhere: a built wheel (not an editable checkout) carries the configs,
and ``nas-run`` from it trains from an empty directory; a user's own config folder adds a
scheme without touching the package."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the wheel is built in this checkout's build/ folder (setuptools builds in the source tree): two workers
# building it at once removed each other's files ("error: [Errno 2] No such file or directory", seen in a
# full run). One worker runs these tests (pyproject's --dist loadgroup), so one wheel is built per test run
pytestmark = pytest.mark.xdist_group("packaging")


def test_every_python_package_is_listed_for_the_wheel():
    """pyproject lists the packages explicitly (conf/ is mapped to nas_cli.conf): a new
    package folder that is not listed would be missing from every non-editable install."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for top in ("nas_cli", "tasks")
             for p in (ROOT / top).rglob("__init__.py")}
    assert found - {"nas_cli.conf"} <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"
    assert "nas_cli.conf" in listed


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
                           capture_output=True, text=True, timeout=600, check=False)
    assert build.returncode == 0, build.stderr[-2000:]
    (whl,) = out.glob("nas_run-*.whl")
    return whl


def test_wheel_ships_every_config(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"nas_cli/conf/{p.relative_to(ROOT / 'conf').as_posix()}" for p in (ROOT / "conf").rglob("*.yaml")}
    assert expected and expected <= names, sorted(expected - names)[:5]


def test_installed_wheel_trains_from_an_empty_directory(wheel, tmp_path):
    """A fresh virtual environment with the wheel installed (not editable): ``nas-run`` must
    find its configs through the package, and a user's folder (``hydra.searchpath``) adds a
    scheme named only at one location."""
    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True, timeout=300)
    py = env_dir / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # the dependencies come from this environment's site-packages (a .pth line: its own .pth
    # files, this checkout's editable hook among them, are not processed there), nas-run from the wheel
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, timeout=300,
                   capture_output=True)
    work = tmp_path / "empty"
    my_conf = tmp_path / "my_conf" / "attention"
    my_conf.mkdir(parents=True)
    (my_conf / "my_unas.yaml").write_text("name: my_unas\n_target_: nas_cli.attention.unas.UNAS\n")
    work.mkdir()
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": ""}
    where = subprocess.run([str(py), "-c", "import nas_cli; print(nas_cli.__file__)"], capture_output=True,
                           text=True, cwd=work, env=env, check=True).stdout
    assert str(env_dir) in where and str(ROOT) not in where  # the installed copy, not this checkout
    run = subprocess.run([str(env_dir / "bin" / "nas-run"), "trainer.max_steps=20", "progress_bar=false",
                          "logger=csv", f"hydra.searchpath=[file://{my_conf.parent}]", "attention.decoder=my_unas"],
                         capture_output=True, text=True, cwd=work, env=env, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    (summary,) = work.glob("outputs/runs/reverse/*/*/summary.json")
    import json

    data = json.loads(summary.read_text())
    assert data["steps"] == 20 and data["placement"]["decoder"] == "my_unas"
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    if head.returncode == 0:  # built from a checkout: the run records the commit the wheel was built from
        assert data["code"]["commit"] == head.stdout.strip() and isinstance(data["code"]["dirty"], bool)


def test_the_tests_find_each_command_by_name_in_a_checkout_named_nas_run(tmp_path, monkeypatch):
    """``git clone <repo> nas-run`` names the checkout nas-run, so its venv's scripts folder is
    .../nas-run/.venv/bin: the tests' helper finds nas-report there by its name, where rewriting
    nas-run's path to nas-report also renamed the checkout folder (.../nas-report/.venv/bin/nas-report)."""
    import sys

    import helpers

    bin_dir = tmp_path / "nas-run" / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("python", "nas-run", "nas-report", "nas-eval"):
        (bin_dir / name).write_text("")
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    assert helpers.script("nas-report") == str(bin_dir / "nas-report")
    assert helpers.script("nas-eval") == str(bin_dir / "nas-eval")
    assert str(bin_dir / "nas-run").replace("nas-run", "nas-report") != str(bin_dir / "nas-report")  # the old way
