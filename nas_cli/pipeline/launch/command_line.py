"""What ``nas-run`` does to its arguments before Hydra parses them.

Each step is a rewrite a user would otherwise have to know about, or a check that gives one line
where Hydra would print a traceback: ``-m`` anywhere on the line, ``attention.decoder=`` as an
alias, a continued sweep's overrides in its saved order, ``seed=auto`` as the sequential sweeper,
typos with the closest name, a swept scheme's options, output directories that cannot be made, and ``resume=<run dir>``.
:func:`hydra_argv` applies them in that order.
"""
from __future__ import annotations

import os
from pathlib import Path

from nas_cli.errors import UserError
from nas_cli.infra.rundir import CONTINUE_ENV, SAVE_CONFIG_ENV
from nas_cli.model.choices import CONF_DIR
from nas_cli.model.plan import location_alias
from nas_cli.pipeline.launch.overrides import check_overrides, check_resume_overrides, swept_scheme_options
from nas_cli.sweeps.continuation import saved_sweep_order


def hydra_argv(argv: list[str]) -> list[str]:
    """The arguments Hydra gets for what the user typed (``argv`` without the program name).
    Raises UserError, with the one line to print, for what Hydra would refuse with a traceback."""
    argv = multirun_first(argv)
    argv = location_alias(argv)  # attention.decoder=x: see nas_cli/model/plan.py
    argv = saved_sweep_order(argv)
    argv = sequential_argv(argv)
    added = check_overrides(argv, CONF_DIR)  # typos: one line with the closest name, before Hydra
    argv = [f"+{a}" if a in added else a for a in argv]  # trainer.<Lightning argument> no preset sets
    argv = swept_scheme_options(argv, CONF_DIR)  # a swept scheme's option: checked for each, composable
    check_sweep_values(argv)
    check_output_dirs(argv)
    return saved_by_the_job(resume_argv(argv))


def saved_by_the_job(argv: list[str]) -> list[str]:
    """A single run's ``.hydra/`` is written by the job once its checks pass (:mod:`nas_cli.pipeline.job`), not by
    Hydra before the job starts: a refused value leaves nothing behind, and a directory that held a run keeps its
    saved config. A sweep's jobs, ``resume=`` (which writes none) and a ``hydra.output_subdir`` given on the
    command line are left to Hydra."""
    if any(a in ("-m", "--multirun") or a in _ONLY_SHOW for a in argv) or \
            any(a.lstrip("+~").startswith("hydra.output_subdir=") for a in argv):
        return argv
    os.environ[SAVE_CONFIG_ENV] = ".hydra"
    return [*argv, "hydra.output_subdir=null"]


#: Hydra's flags that take a value (``--info`` takes one optionally: one of _INFO)
_VALUED = frozenset({"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
           "--experimental-rerun", "--shell-completion", "-sc"})
_INFO = frozenset({"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"})


def multirun_first(argv: list[str]) -> list[str]:
    """Hydra's flags wherever they were typed (``nas-run trainer=ddp hydra/launcher=slurm -m seed=1,2,3``,
    ``nas-run resume=<dir> trainer.max_steps=9 --cfg job``): Hydra's parser takes them only before the
    overrides (after them: "unrecognized arguments"), so they are moved to the front, each with its
    value; ``-m`` / ``--multirun`` becomes ``-m``."""
    flags, rest, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-m", "--multirun"):
            flags.insert(0, "-m")
        elif arg in _VALUED and i + 1 < len(argv):
            flags += [arg, argv[i + 1]]
            i += 1
        elif arg in ("--info", "-i") and i + 1 < len(argv) and argv[i + 1] in _INFO:
            flags += [arg, argv[i + 1]]
            i += 1
        elif arg.startswith("-"):
            flags.append(arg)
        else:
            rest.append(arg)
        i += 1
    return [*dict.fromkeys(f for f in flags if f == "-m"), *[f for f in flags if f != "-m"], *rest]


def sequential_argv(argv: list[str]) -> list[str]:
    """``seed=auto`` selects the sequential sweeper (nas_cli/sweeps/sequential.py): seeds in rounds until every
    comparison is decided. It needs ``-m`` and no other sweeper."""
    if "seed=auto" not in argv:
        return argv
    if not any(a in ("-m", "--multirun") for a in argv):
        raise UserError("seed=auto runs seeds in rounds until every comparison is decided: add -m, e.g. "
                        "nas-run -m attention=unas,dnas seed=auto")
    other = [a for a in argv if a.startswith(("sweep=", "hydra/sweeper=")) and a != "hydra/sweeper=sequential"]
    if other:
        raise UserError(f"seed=auto is the sequential sweeper; it cannot be combined with {other[0]}")
    swept = [a for a in argv if "=" in a and not a.lstrip("+~").startswith(("hydra", "seed="))
             and "," in a.partition("=")[2]]
    if not swept:  # said here, before the sweep's first line (the sweeper says it too, for a sweep it is given)
        raise UserError("seed=auto compares configurations: sweep at least one option, e.g. attention=unas,dnas")
    return argv if "hydra/sweeper=sequential" in argv else [*argv, "hydra/sweeper=sequential"]


#: Hydra's flags that print and write nothing
_ONLY_SHOW = ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc")


def check_sweep_values(argv: list[str]) -> None:
    """A sweep list that names a value twice (``seed=1,1``) would train the same job twice: one line.
    Hydra's own parser reads the lists (``a,b``, ``choice(...)``, ``range(...)``); what it cannot
    parse is left to Hydra's own message."""
    if not any(a in ("-m", "--multirun") for a in argv):
        return
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        try:
            override = parser.parse_override(arg)
            values = list(override.sweep_iterator()) if override.is_sweep_override() else []
        except Exception:  # noqa: BLE001 - Hydra says what is wrong with it
            continue
        seen: list[str] = []
        for value in map(str, values):
            if value in seen:
                raise UserError(f"{arg} lists {value} twice: the sweep would train the same job twice; remove the "
                                "repeat")
            seen.append(value)


def check_output_dirs(argv: list[str]) -> None:
    """``hydra.run.dir=`` / ``hydra.sweep.dir=`` that cannot be created, or, without them, a working
    directory where the default ``outputs/`` cannot be made (a read-only one): one line, before Hydra
    (which would print its own traceback). The check creates the directory and removes what it
    created, so nothing is left behind."""
    if any(a in _ONLY_SHOW for a in argv) or any(a.startswith("resume=") for a in argv):
        return
    key = "hydra.sweep.dir" if any(a in ("-m", "--multirun") for a in argv) else "hydra.run.dir"
    if not any(a.lstrip("+~").startswith(f"{key}=") for a in argv):
        default = Path("outputs")
        probe = default if default.exists() else Path.cwd()
        if not os.access(probe, os.W_OK | os.X_OK):
            raise UserError(f"cannot write the run directories under {Path.cwd() / default} (permission denied): run "
                            f"nas-run from a directory you can write, or give {key}=<a directory you can write>")
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or key.lstrip("+~") not in ("hydra.run.dir", "hydra.sweep.dir") or "${" in value:
            continue
        if not value.strip().strip("'\"").strip():  # '' would put the run's files in the current directory
            raise UserError(f"{key}='': an empty directory; give the directory for the "
                            f"{'run' if 'run' in key else 'sweep'}'s files (or leave {key} out for the default)")
        path = Path(value.strip("'\"")).expanduser()
        missing = []
        probe = path
        while not probe.exists() and probe != probe.parent:
            missing.append(probe)
            probe = probe.parent
        try:
            path.mkdir(parents=True, exist_ok=True)
            if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
                raise PermissionError(13, "not a writable directory")
        except OSError as err:
            raise UserError(f"{key}={value}: cannot create or write the directory ({err.strerror or err}); "
                            "choose a directory you can write") from None
        finally:
            for made in missing:  # the directories this check created, deepest first
                try:
                    made.rmdir()
                except OSError:
                    break


def resume_argv(argv: list[str]) -> list[str]:
    """``nas-run resume=<run dir> [key=value ...]`` -> Hydra arguments that run that directory's
    saved config again, in that directory (nothing new is created; Hydra writes no new .hydra/).
    Plain ``key=value`` overrides apply on top (e.g. ``trainer.max_steps=...``)."""
    dirs = [a.split("=", 1)[1] for a in argv if a.startswith("resume=")]
    if not dirs:
        return argv
    rest = [a for a in argv if not a.startswith("resume=")]
    if len(dirs) > 1 or any(a in ("-m", "--multirun") for a in rest):
        raise UserError("resume= takes one run directory and cannot be combined with -m")
    from nas_cli.infra.resume import check_resumable  # Lightning: only for resume=

    run_dir = Path(dirs[0]).expanduser().resolve()
    check_resumable(run_dir, rest)
    added = check_resume_overrides(run_dir, rest, CONF_DIR)  # group choices and typos: one line, before Hydra
    rest = [f"+{a}" if a in added else a for a in rest]  # trainer.<Lightning argument> the saved config lacks
    os.environ[CONTINUE_ENV] = str(run_dir)
    quoted = str(run_dir).replace("\\", "\\\\").replace("'", "\\'")
    return ["--config-path", str(run_dir / ".hydra"), "--config-name", "config", *rest,
            f"hydra.run.dir='{quoted}'", "hydra.output_subdir=null"]

