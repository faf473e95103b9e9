"""benchmarks/gpu_measure.sh, the one script that measures on a GPU, without a GPU: bash runs the
script as written, with each program it starts replaced by a stand-in that records its command line and
exits 0; each recorded command line is then put through the real program's own argument checks (its
parser, its scheme and form names, nas-run's override check). A misspelled option or scheme would
otherwise be found only on the GPU, minutes into a run whose time is short."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_measure.sh"
SEP = "\x1e"  # ends one recorded command line in the log

#: the stand-in: the program's name and arguments, one per line, then SEP, in one write (the steps run side
#: by side); `timeout` runs the rest of its line
SHIM = f"""#!/bin/sh
if [ "$(basename "$0")" = timeout ]; then
    while [ "${{1#--}}" != "$1" ]; do shift; done
    shift
    exec "$@"
fi
rec=$(basename "$0")
for a in "$@"; do rec="$rec
$a"; done
printf '%s\\n{SEP}\\n' "$rec" >> "$SHIM_LOG"  # one write: the steps run side by side
[ "$(basename "$0")" = nvidia-smi ] && echo "NVIDIA H200"
exit 0
"""
PROGRAMS = ("timeout", "nas-bench", "nas-run", "python", "python3", "nvidia-smi")


def _recorded(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]], Path]:
    shims = tmp_path / "bin"
    shims.mkdir()
    for name in PROGRAMS:
        (shims / name).write_text(SHIM)
        (shims / name).chmod(0o755)
    log, out = tmp_path / "calls.log", tmp_path / "out"
    log.touch()
    proc = subprocess.run(["bash", str(SCRIPT), str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "SHIM_LOG": str(log), **env})
    calls = [c.strip("\n").split("\n") for c in log.read_text().split(SEP + "\n") if c.strip("\n")]
    return proc, calls, out


def _check(argv: list[str]) -> str:
    """Put one recorded command line through its program's own checks; returns what it was."""
    name, args = argv[0], argv[1:]
    if name == "nas-bench":
        from nas_cli.bench.attention import valid_schemes
        from nas_cli.bench.train import check_scheme, train_schemes
        from nas_cli.commands.nas_bench import make_parser

        ns = make_parser().parse_args(args)  # argparse ends the test (SystemExit) on a bad option
        if ns.command == "attention":
            bad = [s for s in ns.schemes if s not in valid_schemes()]
            assert not bad, f"nas-bench attention: unknown scheme(s) {bad}"
        elif ns.command == "train":
            bad = [why for why in (check_scheme(s, train_schemes()) for s in ns.schemes) if why]
            assert not bad, f"nas-bench train: {bad}"
        return f"nas-bench {ns.command}"
    if name in ("python", "python3") and args[0] == "-c":
        return "python -c"
    if name == "python" and args[0] == "benchmarks/triton_check.py":
        parse_args = load_benchmark("triton_check").parse_args

        parse_args(args[1:])
        return "triton_check"
    if name == "python" and args[0] == "benchmarks/hf_step.py":
        make_parser = load_benchmark("hf_step").make_parser

        make_parser().parse_args(args[1:])
        return "hf_step"
    if name == "nas-run":
        from nas_cli.model.choices import CONF_DIR
        from nas_cli.pipeline.launch.overrides import check_overrides

        check_overrides(args, CONF_DIR)  # a UserError ends the test: an unknown key, group or choice
        return "nas-run"
    if name == "nvidia-smi":
        return "nvidia-smi"
    raise AssertionError(f"gpu_measure.sh starts a program this test does not know: {argv}")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("env,expected", [
    ({}, {"triton_check": 5, "hf_step": 1, "nas-bench attention": 11, "nas-bench gpu-check": 2,
          "nas-bench train": 1}),
    ({"ONLY_TRITON": "1"}, {"triton_check": 5, "hf_step": 1, "nas-bench attention": 9}),
    ({"ONLY_TRITON": "1", "LONG": "1", "SKIP_HF": "1"}, {"triton_check": 5, "nas-bench attention": 12}),
    ({"MULTI30K": "/data/multi30k", "SKIP_WARM": "1"},
     {"triton_check": 5, "hf_step": 1, "nas-bench attention": 5, "nas-bench gpu-check": 2, "nas-bench train": 1,
      "nas-run": 1}),
], ids=["everything", "only-triton", "long", "multi30k-no-warm"])
@pytest.mark.slow  # a benchmark script run end to end
def test_every_command_of_the_gpu_script_passes_its_programs_own_checks(tmp_path, env, expected):
    proc, calls, out = _recorded(tmp_path, **env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    kinds = [_check(c) for c in calls]
    counts = {k: kinds.count(k) for k in set(kinds) - {"python -c", "nvidia-smi"}}
    assert counts == expected, counts
    steps = (out / "steps.txt").read_text().splitlines()
    assert steps and all(": exit 0 after" in s for s in steps), steps


def test_the_check_catches_a_misspelled_option_and_scheme(tmp_path):
    # the test above would fail on the mistakes a hand edit of the script makes
    with pytest.raises(SystemExit):
        _check(["nas-bench", "attention", "--device", "cuda", "--lenghts", "1024"])
    with pytest.raises(AssertionError, match="dnas-trition"):
        _check(["nas-bench", "attention", "--schemes", "unas,dnas-trition"])
    with pytest.raises(SystemExit):
        _check(["python", "benchmarks/triton_check.py", "--forms", "encoder,prefx"])
    from nas_cli.errors import UserError

    with pytest.raises(UserError, match="trainer.max_step"):
        _check(["nas-run", "-m", "experiment=study_multi30k", "trainer.max_step=5"])


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi: the script would run")
def test_without_a_gpu_the_script_stops_at_once_in_one_line(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(SCRIPT), str(out)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "no NVIDIA GPU on this machine" in proc.stderr
    assert not out.exists()  # nothing made
