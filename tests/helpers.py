"""Shared helpers for tests: compose the real config, build cores straight from the registry."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
import zygote
from hydra import compose, initialize_config_dir
from hydra.utils import get_class
from omegaconf import OmegaConf

from nas_cli.model.plan import location_alias
from nas_cli.model.contract import qkv as contract_qkv
from nas_cli.model.choices import CONF_DIR
from nas_cli.model.plan import make_core_factory


def compose_cfg(*overrides: str, config_dir=CONF_DIR):
    """The config ``nas-run <overrides>`` would run, composed by Hydra from the real config
    folder (nas-run's short ``attention.<location>=<scheme>`` spelling included). Inside an
    already initialized Hydra context (a module fixture), composes there."""
    from hydra.core.global_hydra import GlobalHydra

    args = location_alias(list(overrides))
    if GlobalHydra.instance().is_initialized():
        return compose("config", overrides=args)
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return compose("config", overrides=args)


def build_core(scheme: str, heads: int = 4, causal: bool = False, location: str = "encoder", **overrides):
    cfg = OmegaConf.load(CONF_DIR / "attention" / f"{scheme}.yaml")
    for k, v in overrides.items():
        cfg[k] = v
    if get_class(cfg._target_).causal_self_only:  # defined there only: its decoder form
        causal, location = True, "decoder"
    core = make_core_factory(cfg, heads)(location, 0, causal)
    core.set_width(heads * 8)  # width-dependent parameters, as MultiHeadAttention does; d_head 8 = qkv()'s
    torch.manual_seed(0)
    if hasattr(core, "u_logit"):  # make HNAS a genuine mixture with distinct heads
        with torch.no_grad():
            core.u_logit.copy_(torch.linspace(-1.5, 1.5, heads))
    for p in core.parameters():  # schemes with their own parameters: non-trivial values
        if p.requires_grad and p.dim() > 1:
            torch.nn.init.normal_(p, std=0.3)
    return core.eval()


#: seeded random queries, keys and values (B, H, S, D): the contract checks' own (nas-bench check-scheme)
qkv = contract_qkv


def script(name: str) -> str:
    """The installed command ``name`` (nas-run, nas-report, nas-eval, ...) of this environment: the
    scripts folder of the Python running the tests, else the PATH's. Found by its name, never by
    rewriting another command's path (a checkout folder may itself be named nas-run)."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or str(here))


#: the installed ``nas-run`` of this environment
NAS_RUN = script("nas-run")


def glob_now(root: Path, pattern: str) -> list[Path]:
    """``sorted(root.glob(pattern))`` while a command may be making ``root``: nas-run makes a run or sweep
    directory it has not made yet to check that it can write there, and removes it again at once. Path.glob
    tests that ``root`` is a directory, then lists it: a removal in between raised FileNotFoundError."""
    try:
        return sorted(root.glob(pattern))
    except FileNotFoundError:
        return []


def run_command(argv, *, cwd=None, env=None, timeout=None, check=False, capture_output=True,
                text=True) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True, ...)``. One of this environment's
    nas-* commands runs in a process forked from a server that imported torch, Lightning and
    Hydra once (tests/zygote.py; ``NAS_TEST_ZYGOTE=0`` turns that off): the same installed
    script, in a process of its own, without its 5 seconds of imports."""
    assert capture_output and text, "run_command captures text output, as the tests read it"
    argv = [str(a) for a in argv]
    if zygote.serves(*argv[:2]):
        proc = zygote.run(argv, cwd=os.getcwd() if cwd is None else cwd,
                          env=dict(os.environ) if env is None else env, timeout=timeout)
    else:
        proc = subprocess.run(argv, cwd=cwd, env=env, timeout=timeout, capture_output=True, text=True,
                              preexec_fn=zygote.terminal_signals)
    if check:
        proc.check_returncode()
    return proc


def start_command(argv, *, cwd, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE):
    """``subprocess.Popen(argv, ..., text=True, start_new_session=True)``: a command started for a
    test to watch and signal (its ``pid`` is also its process group). A nas-* command runs in a
    process forked from the test server, as :func:`run_command` does (tests/zygote.py), without its
    imports; a test that needs the installed script's own process (signal dispositions inherited
    from the caller) uses ``subprocess.Popen``."""
    argv = [str(a) for a in argv]
    if zygote.serves(*argv[:2]):
        return zygote.popen(argv, cwd=cwd, env=env, stdout=stdout, stderr=stderr)
    return subprocess.Popen(argv, cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=True, start_new_session=True,
                            preexec_fn=zygote.terminal_signals)


def nas_run(*args, cwd, timeout=300):
    """The real ``nas-run`` command in a process of its own, logging to W&B as configured (offline)."""
    env = {**os.environ, "WANDB_MODE": "", "NO_COLOR": "1"}
    env.pop("WANDB_MODE")
    return run_command([NAS_RUN, *args], cwd=cwd, env=env, timeout=timeout)


def load_benchmark(name: str):
    """A script of benchmarks/ (not a package) as a module, e.g. load_benchmark("calibration"); the
    scripts beside it importable while it loads (``from study_common import ...``)."""
    import importlib.util
    import sys

    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(folder))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(folder))
    return mod


def holm_adjusted(p) -> "np.ndarray":
    """Holm's step-down adjusted p-values, written out (the reference nas-report's families are checked against):
    sorted ascending, the k-th smallest times (m - k), never below the one before it, at most 1."""
    import numpy as np

    p = np.asarray(p, float)
    order = np.argsort(p)
    adj, running = np.empty(len(p)), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        adj[i] = running
    return adj


def assert_steps_equal_recomputing(model, batch: int = 3, steps: int = 6, vocab: int = 25) -> dict:
    """Incremental decoding of an encoder-decoder ``model`` (nas-run's or a Hugging Face pair) equals running its
    decoder on the whole prefix, at every one of ``steps`` positions of random source and target tokens. Returns
    the decoding cache, for what a test asks of it."""
    import torch

    memory, memory_mask, _ = model.encode(torch.randint(3, vocab, (batch, 6)))
    cache, prefix = {}, torch.ones(batch, 1, dtype=torch.long)
    for _ in range(steps):
        step = model.decode_step(prefix[:, -1:], memory, memory_mask, cache)
        full, _ = model.decode(prefix, memory, memory_mask)
        torch.testing.assert_close(step, full[:, -1], rtol=1e-5, atol=1e-5)
        prefix = torch.cat([prefix, torch.randint(3, vocab, (batch, 1))], 1)
    return cache


def assert_lm_causal(lm, vocab: int = 20, at: int = 5) -> None:
    """A language model's outputs before position ``at`` do not change when the tokens from ``at`` on do, and
    those after do (the model reads its input)."""
    import torch

    ids = torch.randint(3, vocab, (2, 2 * at))
    changed = ids.clone()
    changed[:, at:] = torch.randint(3, vocab, (2, at))
    a, _ = lm(ids)
    b, _ = lm(changed)
    torch.testing.assert_close(a[:, :at], b[:, :at], rtol=0, atol=1e-5)
    assert not torch.allclose(a[:, at:], b[:, at:])


def section_commands(page: str, heading: str) -> list[list[str]]:
    """The commands of the first ``bash`` block after ``heading`` in docs/<page>, one argv per line, as a user
    would type them (the docs' own words, run as written by the tests that call this)."""
    import shlex

    text = (Path(__file__).resolve().parents[1] / "docs" / page).read_text()
    block = text.split(heading)[1].split("```bash")[1].split("```")[0]
    return [shlex.split(line) for line in block.strip().splitlines()]
