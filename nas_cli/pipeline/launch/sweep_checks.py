"""A sweep's launcher options checked before the sweep directory is made: one line naming the option
and the fix, where the launcher would otherwise fail after the directory exists (joblib's
``n_jobs=0``; the SLURM launcher on a machine without SLURM, or whose controller does not answer)."""
from __future__ import annotations

import os

from omegaconf import DictConfig

from nas_cli.errors import UserError
from nas_cli.sweeps.design import tuned_options


def check_ray_cluster(cfg: DictConfig) -> None:
    """``trainer=ray_ddp`` with ``RAY_ADDRESS`` set: the cluster it names is found before anything is made."""
    import os

    from nas_cli.infra.ray_train import on_ray

    if "trainer" in cfg and on_ray(cfg) and os.environ.get("RAY_ADDRESS"):
        try:
            _check_ray_address(os.environ["RAY_ADDRESS"])
        except UserError as err:
            raise UserError(str(err).replace("hydra/launcher=ray: ", "trainer=ray_ddp: ")
                            .replace("hydra.launcher.ray.init.address=", "RAY_ADDRESS=")
                            .replace("leave the address unset", "unset RAY_ADDRESS")) from None


def _check_ray_address(address) -> None:
    """An address that names a Ray cluster (``auto``, host:port) is found before the sweep is announced or
    made: the same lookup ``ray.init`` starts with (no address, or ``local``: a Ray on this machine)."""
    if address in (None, "", "local") or str(address).startswith("ray://"):
        return
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:  # another Ray: the launcher's own connection says it
        return
    try:
        canonicalize_bootstrap_address(str(address))
    except (ConnectionError, ValueError) as err:
        first = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        raise UserError(f"hydra/launcher=ray: no Ray cluster at hydra.launcher.ray.init.address={address} ({first}); "
                        "start one (ray start --head) or leave the address unset for a Ray on this machine") from None


def check_launcher(cfg: DictConfig) -> None:
    """A sweep's launcher options that would fail in the launcher, after the sweep directory is
    made (joblib's ``n_jobs=0``; the SLURM launcher on a machine without SLURM): one line before
    anything is made."""
    launcher = cfg.get("hydra", {}).get("launcher") if "hydra" in cfg else None
    target = str(launcher.get("_target_", "")) if launcher else ""
    if "submitit" in target and "Slurm" in target:
        import shutil

        if shutil.which("srun") is None or shutil.which("sbatch") is None:
            raise UserError("hydra/launcher=slurm: this machine has no SLURM (srun and sbatch not found); run the "
                            "command on a SLURM cluster's login node, or drop hydra/launcher=slurm (or use "
                            "hydra/launcher=joblib) to run the jobs here")
        unreachable = _slurm_unreachable()
        if unreachable:
            raise UserError(f"hydra/launcher=slurm: SLURM's tools are installed but no controller answers ({unreachable}); "
                            "run the command on a SLURM cluster's login node (or set SLURM_CONF to the cluster's "
                            "slurm.conf), or drop hydra/launcher=slurm to run the jobs here")
        return
    if "nas_run_ray" in target:
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise UserError('hydra/launcher=ray: Ray is not installed; install nas-run with its ray extra: '
                            'pip install "nas-run[ray]" (from a checkout: pip install -e ".[ray]")')
        _check_ray_address(((launcher.get("ray") or {}).get("init") or {}).get("address"))
        return
    if "joblib" not in target:
        return
    n_jobs = launcher.get("n_jobs")
    if not (n_jobs is None or (isinstance(n_jobs, int) and not isinstance(n_jobs, bool) and n_jobs != 0)):
        raise UserError(f"hydra.launcher.n_jobs={n_jobs} is not valid: it must be a number of parallel jobs >= 1, "
                        "or -1 for one per CPU core (e.g. hydra.launcher.n_jobs=2)")


def _slurm_unreachable(timeout_s: float = 15.0) -> str | None:
    """Why no SLURM controller answers here (sinfo's last error line), None when one does."""
    import subprocess

    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.isfile(conf):  # sinfo would retry for a minute before saying so
        return f"SLURM_CONF={conf}: no such file"
    try:
        proc = subprocess.run(["sinfo", "--noheader", "--format=%P"], capture_output=True, text=True,
                              timeout=timeout_s)
    except OSError as err:
        return f"sinfo: {err}"
    except subprocess.TimeoutExpired:
        return f"sinfo did not answer within {timeout_s:g} s"
    if proc.returncode == 0:
        return None
    lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
    fatal = [ln for ln in lines if "fatal" in ln] or lines
    return fatal[-1] if fatal else f"sinfo exited with {proc.returncode}"


def check_tune(cfg: DictConfig) -> None:
    """A tuned sweep (``tune=[optim.lr]``): every tuned option is swept over at least two values, and
    held-apart ``tune_seeds`` are among the listed seeds (not ``seed=auto``, which chooses at every look)
    with two or more left for the verdicts. One line before the sweep directory is made."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    keys = tuned_options(cfg.get("tune"))
    held = cfg.get("tune_seeds")
    if not keys:
        if held:
            raise UserError(f"tune_seeds={_shown(held)} chooses the values of tuned options: add tune=[optim.lr] "
                            "(the swept options to tune)")
        return
    overrides = OverridesParser.create().parse_overrides([str(x) for x in cfg.hydra.overrides.task])
    swept = {o.get_key_element().lstrip("+~"): [str(v) for v in o.sweep_iterator()]
             for o in overrides if o.is_sweep_override()}
    for key in keys:
        if len(swept.get(key, [])) < 2:
            import difflib

            close = difflib.get_close_matches(key, [k for k in swept if k not in keys], n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}, which is swept?)" if close else ""
            raise UserError(f"tune=[{','.join(keys)}]: {key} is not swept over two or more values in this sweep{hint}; "
                            f"give it the values to choose from, e.g. {key}=1e-3,2e-3 (or leave it out of tune)")
    if held and str(cfg.get("seed")) == "auto":
        raise UserError(f"tune_seeds={_shown(held)} with seed=auto: a sequential sweep chooses each value on the "
                        "seeds of every look (same-seed selection); leave tune_seeds out, or list the seeds "
                        "(seed=1,2,3,4)")
    if held:
        held = [int(s) for s in ([held] if isinstance(held, (int, str)) else held)]
        seeds = [int(s) for s in swept.get("seed", [cfg.get("seed")])]
        missing = [s for s in held if s not in seeds]
        if missing:
            raise UserError(f"tune_seeds={_shown(held)}: seed {missing[0]} is not among the sweep's seeds "
                            f"({','.join(map(str, seeds))}); list it in seed=... too")
        if len([s for s in seeds if s not in held]) < 2:
            raise UserError(f"tune_seeds={_shown(held)} leaves fewer than 2 verdict seeds of "
                            f"seed={','.join(map(str, seeds))}; add seeds (a verdict over seeds needs 2)")


def _shown(value) -> str:
    return "[" + ",".join(map(str, value)) + "]" if isinstance(value, (list, tuple)) or hasattr(value, "__iter__") \
        and not isinstance(value, str) else str(value)


def first_job(config: DictConfig) -> DictConfig:
    """The config the sweep's own check checks: the sweep's, with each swept config group (``attention=a,b``) at
    its first choice. Hydra composes a sweep's config without its sweep overrides, so with the defaults of what is
    swept (``attention=unas`` where the sweep says ``attention=deltanet,mamba2``), which need not take the
    options given beside them. Swept values (``model.heads=3,4``) stay at their defaults: a bad one fails its own
    job, and the sweep's other jobs run. A sweep that sweeps no group is checked as composed."""
    from hydra import compose
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    overrides = [str(o) for o in config.hydra.overrides.task]
    groups = set(config.hydra.runtime.choices)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        if not any(o.is_sweep_override() and o.key_or_group in groups for o in parsed):
            return config
        first = [f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}" if o.is_sweep_override()
                 and o.key_or_group in groups else text for o, text in zip(parsed, overrides)
                 if not (o.is_sweep_override() and o.key_or_group not in groups)]
    except (HydraException, ValueError, StopIteration):
        return config
    hydra_overrides = [str(o) for o in config.hydra.overrides.hydra]  # its search path, launcher, directories
    return compose(config_name=str(config.hydra.job.config_name), overrides=[*hydra_overrides, *first],
                   return_hydra_config=True)
