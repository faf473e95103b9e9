"""The tests' way of starting nas-* commands (tests/zygote.py): a child forked from a server that
imported the heavy libraries once must behave as the installed script started by subprocess."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

import zygote
from helpers import NAS_RUN, run_command

pytestmark = pytest.mark.skipif(not zygote.serves(NAS_RUN), reason="the tests' nas-run is not served by the zygote")


def _env(**extra):
    return {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **extra}


@pytest.mark.parametrize("args", [("atention=dnas",), ("--cfg", "job", "debug=fast", "attention=hnas"),
                                  ("task.path=/nope", "task=wikitext2")])
@pytest.mark.slow  # the installed script in plain processes, 5-10 s of imports each
def test_a_forked_command_prints_and_exits_as_the_installed_script(tmp_path, args):
    forked = zygote.run([NAS_RUN, *args], cwd=tmp_path, env=_env(), timeout=120)
    real = subprocess.run([NAS_RUN, *args], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr)
    assert forked.stdout or forked.stderr


EXITS = {  # what a process does on its way out, each as a `python -c` program
    "status": "import sys; print('out'); sys.exit(3)",
    "message": "import sys; sys.exit('bye')",
    "atexit": "import atexit; atexit.register(print, 'at exit')",
    "thread": "import threading, time; threading.Thread(target=lambda: (time.sleep(0.3), print('joined'))).start()",
    "unflushed": "import sys; sys.stdout.write('no newline'); sys.stderr.write('err, no newline')",
    "exception": "raise ValueError('boom')",
    "interrupt": "raise KeyboardInterrupt",
}


@pytest.mark.parametrize("name", EXITS)
def test_a_forked_command_ends_as_python_ends_a_process(tmp_path, name):
    """The server ends its children as the interpreter's exit would, less the teardown of every
    module (2 s a command): exit status, SystemExit's message, atexit functions, non-daemon
    threads joined, streams flushed, a traceback, a death by SIGINT."""
    import sys

    argv = [sys.executable, "-c", EXITS[name]]
    assert zygote.serves(*argv[:2])
    forked = zygote.run(argv, cwd=tmp_path, env=_env(), timeout=60)
    real = subprocess.run(argv, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60)
    assert (forked.returncode, forked.stdout) == (real.returncode, real.stdout)
    # a traceback's frames differ (the server's own are above the program's); its last line does not
    assert forked.stderr.splitlines()[-1:] == real.stderr.splitlines()[-1:], (forked.stderr, real.stderr)


def test_a_forked_command_sees_its_own_environment_and_pythonpath(tmp_path):
    # a config package found through PYTHONPATH, and a variable the server never saw
    conf = tmp_path / "lib" / "my_pkg_zyg" / "conf"
    (conf / "attention").mkdir(parents=True)
    for pkg in (conf.parent, conf):
        (pkg / "__init__.py").write_text("")
    (conf / "attention" / "mine.yaml").write_text("name: mine\n_target_: my_pkg_zyg.nothing.Here\n")
    args = [NAS_RUN, "--cfg", "job", "--resolve", "attention=mine", "hydra.searchpath=[pkg://my_pkg_zyg.conf]",
            "+zyg=${oc.env:ZYG_VALUE}"]
    proc = run_command(args, cwd=tmp_path, env=_env(PYTHONPATH=str(tmp_path / "lib"), ZYG_VALUE="seen"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "my_pkg_zyg.nothing.Here" in proc.stdout and "zyg: seen" in proc.stdout
    without = run_command(args, cwd=tmp_path, env=_env(ZYG_VALUE="seen"), timeout=120)  # and no stale sys.path
    assert without.returncode != 0 and "mine" in without.stderr


@pytest.mark.slow  # a run killed at its timeout
def test_a_timeout_ends_the_command_and_its_process_group(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.run([NAS_RUN, "debug=fast", "trainer.max_steps=100000", "trainer.max_epochs=null", "task.num_workers=1"],
                   cwd=tmp_path, env=_env(), timeout=8)
    deadline = time.monotonic() + 20  # killed at once; reaped by init soon after
    while (left := subprocess.run(["pgrep", "-g", str(zygote.last_pid)], capture_output=True, text=True).stdout.split()):
        assert time.monotonic() < deadline, f"processes left in the command's group: {left}"
        time.sleep(0.2)
    again = run_command([NAS_RUN, "atention=x"], cwd=tmp_path, env=_env(), timeout=120)  # the server goes on
    assert again.returncode == 2
