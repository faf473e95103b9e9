"""Option values checked before anything is made: one line naming the key and the fix.

:func:`check_config` runs in each job on its composed config (:mod:`nas_cli.pipeline.job`: a single run's
saved configs are written once it passes), on a sweep's first job's config before the sweep starts
(``RunGuard.on_multirun_start``), and on a resumed run's saved config before Hydra starts. It catches what would otherwise fail
deep inside a run, or worse, run silently wrong: a number given as text (``model.heads=four``,
``seed=abc``), a learning rate <= 0, a batch size or token budget of 0 (each against the type and
range its option declares: nas_cli/pipeline/sections.py says where), and a model too large
for this machine's memory (estimated from the sizes, before anything is allocated), and a
scheme that cannot run with the model as configured (the attention plan's cross-group
check, e.g. a ``pe_*`` scheme with ``model.positions`` not ``none``).
"""
from __future__ import annotations

import os
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf

from nas_cli.errors import UserError
from nas_cli.model.plan import AttentionPlan
from nas_cli.pipeline.checks.sizing import check_memory, model_parameters


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_MISSING = object()


def _get(cfg: DictConfig, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return _MISSING
        try:
            node = node[part]
        except Exception as err:  # noqa: BLE001 - an interpolation that does not resolve
            raise UserError(f"{key}: {str(err).splitlines()[0]}") from None
    return node


class Checked(NamedTuple):
    """What the checks built once for the job: its attention plan (None for a config without
    attention or model), its model's parameters (None: not known before the data are read;
    ``exact`` false: without the vocabulary's embeddings, which the data decide), the notes a user
    should read once (a location that keeps the chunked path under a fused ``impl``), and the task."""

    plan: AttentionPlan | None
    parameters: int | None = None
    exact: bool = True
    notes: tuple[str, ...] = ()
    task: Any = None  # the task as the check built it (its data checked): the job trains with it


def check_config(cfg: DictConfig) -> Checked:
    """Raise UserError (one line) for the first bad value; then count the model's parameters (built
    on the meta device: no weights allocated) and check they fit this machine's memory. Returns the
    job's attention plan, which the job trains with (built here once), and that count."""
    from nas_cli.pipeline.launch.sweep_checks import check_ray_cluster
    from nas_cli.zeroshot.harness import check_config as check_zero_shot

    check_values(cfg)
    check_tune_keys(cfg)
    check_ray_cluster(cfg)  # trainer=ray_ddp with RAY_ADDRESS: the cluster is there
    check_shapes_and_logger(cfg)
    check_positions(cfg)
    plan = check_attention(cfg)
    check_declared(cfg)
    task = check_task_data(cfg)
    check_zero_shot(cfg, task)  # lm_eval.tasks: lm-eval installed, the tasks known, their files there
    if task is not None and "model" in cfg:
        from nas_cli.pipeline.lit import check_readout

        try:
            check_readout(task.name, getattr(task, "readout", None), cfg.model)
        except ValueError as err:
            raise UserError(str(err)) from None
        from nas_cli.pipeline.trainer import budget_steps

        budget_steps(cfg, task)  # a token budget needs steps of a fixed number of tokens
    size = model_parameters(cfg, plan, task)  # nas_cli/pipeline/checks/sizing.py
    if size is not None:
        check_memory(cfg, size[0])
    notes = fused_notes(plan) if plan is not None else ()
    return Checked(plan, *size, notes=notes, task=task) if size else Checked(plan, notes=notes, task=task)


def _dotted_keys(node, prefix: str = "") -> list[str]:
    out = []
    for key, value in node.items():
        name = f"{prefix}{key}"
        out.append(name)
        if isinstance(value, dict):
            out += _dotted_keys(value, f"{name}.")
    return out


def check_tune_keys(cfg: DictConfig) -> None:
    """Each option ``tune=[...]`` names is an option of the config (a single run included, where a key
    that is none would otherwise be ignored): one line with the closest option's name."""
    import difflib

    from nas_cli.sweeps.design import tuned_options

    keys = tuned_options(cfg.get("tune"))
    if not keys:
        return
    tree = OmegaConf.to_container(cfg, resolve=False)
    tree.pop("hydra", None)
    known = _dotted_keys(tree)
    for key in keys:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise UserError(f"tune=[{','.join(keys)}]: {key} is no option of this config{hint}; tune names the swept "
                            "options each scheme chooses its own value of, e.g. tune=[optim.lr]")


def check_values(cfg: DictConfig) -> None:
    """Each value against the type and range its option declares (nas_cli/pipeline/sections.py says
    where each section's are): one line naming the key, what it must be and an example. Keys absent
    from the config (another task's, another model's) are skipped."""
    from nas_cli.infra.options import declared_defaults, declared_types, example_value, type_problem
    from nas_cli.pipeline.sections import sections

    for prefix, owner in sections(cfg):
        if prefix and not isinstance(_get(cfg, prefix), DictConfig):
            continue
        defaults = declared_defaults(owner)
        for name, hint in declared_types(owner).items():
            key = f"{prefix}.{name}" if prefix else name
            value = _get(cfg, key)
            what = None if value is _MISSING else type_problem(value, hint)
            if what:
                shown = f"'{value}'" if isinstance(value, str) else str(value)
                default = defaults.get(name)
                example = default if default is not None and not type_problem(default, hint) else example_value(hint)
                raise UserError(f"{key}={shown} is not valid: it must be {what} (e.g. {key}={example})")


def check_declared(cfg: DictConfig) -> None:
    """Every key of the task, of each diagnostic plug-in and of the diagnostics section is a
    parameter of its class's constructor (nas_cli/infra/options.py; the schemes' are checked by the attention plan): a typo in a
    user's YAML or ``+task.<typo>=`` is one line with the closest name, not an ignored option."""
    from nas_cli.errors import unwrap
    from nas_cli.infra.options import declared, import_target, unknown_option_message

    nodes = [("task", cfg.get("task"), f"task '{cfg.task.get('name', '?')}'" if "task" in cfg else "")]
    metrics = cfg.get("diagnostics", {}).get("metrics") if "diagnostics" in cfg else None
    nodes += [(f"diagnostics.metrics.{k}", v, f"the diagnostic {k}") for k, v in (metrics or {}).items()]
    for where, node, owner in nodes:
        if not isinstance(node, DictConfig) or not node.get("_target_"):
            continue
        try:
            names = declared(import_target(node._target_))
        except Exception as err:  # noqa: BLE001 - not importable: the one line, before anything is made
            raise UserError(f"{where}._target_={node._target_} cannot be imported ({unwrap(err)}); check the "
                            "name, or that its module is on the Python path") from None
        given = OmegaConf.to_container(node, resolve=False)
        for key, value in given.items():
            if names is not None and key != "_target_" and key not in names:
                raise UserError(unknown_option_message(where, str(key), value, owner, names))
    if isinstance(cfg.get("diagnostics"), DictConfig):  # the section is the callback's options, and enabled
        from nas_cli.diagnostics.callback import DiagnosticsCallback

        names = (declared(DiagnosticsCallback) - {"run_dir"}) | {"enabled"}
        for key, value in OmegaConf.to_container(cfg.diagnostics, resolve=False).items():
            if key not in names:
                raise UserError(unknown_option_message("diagnostics", str(key), value, "the diagnostics section", names))


def check_task_data(cfg: DictConfig):
    """Before the run directory is made: the options the task's constructor refuses, the task's own
    check of its data files (``Task.check_data``: a data path that is a file, a missing, empty or
    binary split file), and a model with fewer positions than the task's sequences need."""
    if "task" not in cfg or not cfg.task.get("_target_"):
        return None
    from hydra.utils import instantiate

    from hydra.errors import InstantiationException

    from nas_cli.errors import unwrap

    try:
        task = instantiate(cfg.task, _convert_="all")
    except UserError:
        raise
    except (ValueError, TypeError, InstantiationException, OSError) as err:  # the constructor's refusal
        raise UserError(f"task '{cfg.task.get('name', '?')}': {unwrap(err)}") from None
    from tasks.scores import declaration

    try:
        declaration(task.metrics)  # a task's own metrics, as summary.json and nas-report will read them
    except ValueError as err:
        raise UserError(f"task '{cfg.task.get('name', '?')}': {err}") from None
    task.check_data()
    needed = task.positions_needed()
    have = _get(cfg, "model.max_len")
    if needed and _is_int(have) and needed[0] > have:
        raise UserError(f"{needed[1]} makes training sequences of up to {needed[0]} tokens, more than model.max_len="
                        f"{have} positions: raise model.max_len to {needed[0]} or lower {needed[1].split('=')[0]}")
    from nas_cli.pipeline.lengths import check_eval_lengths

    check_eval_lengths(cfg, task)
    return task


def check_shapes_and_logger(cfg: DictConfig) -> None:
    """Values that otherwise stop a run only once its data are loaded: heads that do not divide
    d_model, an unknown W&B mode."""
    heads, d_model = _get(cfg, "model.heads"), _get(cfg, "model.d_model")
    if _is_int(heads) and _is_int(d_model):
        from nas_cli.model.transformer import check_heads

        try:
            check_heads(int(d_model), int(heads))
        except ValueError as err:
            raise UserError(str(err)) from None
    project = _get(cfg, "logger.project")
    if project is not _MISSING and str(cfg.logger.get("_target_", "")).endswith(".wandb") and \
            (project is None or not str(project).strip()):
        raise UserError(f"logger.project={project!r} is empty: a W&B run needs a project name (W&B's server refuses "
                        "an empty one); give logger.project=<name>, or leave it out for the default (nas-run)")
    mode = _get(cfg, "logger.mode")
    if mode is not _MISSING and str(cfg.logger.get("_target_", "")).endswith(".wandb"):
        if mode not in ("offline", "online", "disabled"):
            raise UserError(f"logger.mode must be offline, online or disabled (got '{mode}')")
        if mode == "online" and not wandb_login_found():
            raise UserError("logger.mode=online needs a W&B login and none was found: run `wandb login` once (or "
                            "set WANDB_API_KEY), or leave logger.mode=offline (the default) and upload later with "
                            "wandb sync <run dir>/wandb/offline-run-*")


def wandb_login_found() -> bool:
    """Whether W&B will find credentials for its server: WANDB_API_KEY or WANDB_IDENTITY_TOKEN_FILE,
    or an entry for the server's host in the netrc file ``wandb login`` writes (``$NETRC``, else
    ~/.netrc). Read with the standard library; W&B itself stays unimported."""
    import netrc
    from pathlib import Path
    from urllib.parse import urlparse

    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    path = Path(os.environ.get("NETRC") or "~/.netrc").expanduser()
    try:
        return netrc.netrc(str(path)).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def check_positions(cfg: DictConfig) -> None:
    """``model.positions`` of nas-run's own Transformer (a Hugging Face family has its own)."""
    value = _get(cfg, "model.positions")
    if value is _MISSING or _get(cfg, "model.family") not in (_MISSING, None):
        return
    from nas_cli.model.embedding import POSITIONS

    if value not in POSITIONS:
        raise UserError(f"model.positions={value} is not valid: it must be one of {', '.join(POSITIONS)} (e.g. "
                        "model.positions=sinusoidal)")
    if value == "alibi" and "task" in cfg and not is_language_model(cfg):
        raise UserError(f"model.positions=alibi is defined for a causal language model's self-attention (Press et al. "
                        f"2022), not for task={cfg.task.get('name')}'s encoder and cross-attention: use "
                        "model.positions=rope or sinusoidal")


def is_language_model(cfg: DictConfig) -> bool:
    """Whether the task of ``cfg`` is a language model (its class's declared ``kind``)."""
    from nas_cli.model.locations import is_language_model as kind_is_lm

    return "task" in cfg and kind_is_lm(cfg.task.get("_target_"))


def check_attention(cfg: DictConfig) -> AttentionPlan | None:
    """The attention plan against the model and task: one line naming the option to change.
    Returns the plan."""
    from nas_cli.attention import SchemeError

    if "attention" not in cfg or "model" not in cfg:
        return None
    try:
        plan = AttentionPlan.for_job(cfg)
        if cfg.model.get("family"):
            check_hf_model(plan, cfg, is_language_model(cfg))
        else:
            plan.check(cfg.model)
    except SchemeError as err:
        raise UserError(str(err)) from None
    check_flex(plan, cfg)
    check_triton(plan, cfg)
    return plan


def check_hf_model(plan, cfg: DictConfig, lm: bool) -> None:
    """``model=hf_*`` (nas_cli/hf/models.py): Transformers installed, the kind of task the family
    serves, and schemes that can run inside the library's layers (one line naming what to change)."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise UserError(f"model={cfg.model.get('name')} needs Hugging Face Transformers (the hf extra): "
                        "pip install 'transformers>=5.24,<6'") from None
    from nas_cli.hf.attention import refuse_reason
    from nas_cli.hf.models import FAMILIES, wrong_task

    if str(cfg.model.family) not in FAMILIES:
        raise UserError(f"model.family={cfg.model.family} is not a Hugging Face family nas-run maps; choose one "
                        f"of {', '.join(FAMILIES)}")
    wrong = wrong_task(cfg.model, lm)
    if wrong:
        raise UserError(wrong)
    if cfg.model.get("adaptive_softmax") and not lm:
        raise UserError(f"model.adaptive_softmax is for language models; with model={cfg.model.get('name')} "
                        "add model.adaptive_softmax=null")
    for loc in plan.placed:
        reason = refuse_reason(plan.core(loc, 0, loc == "decoder", int(cfg.model.heads)))
        if reason:
            where = f"attention.{loc}" if loc in plan.explicit else "attention"
            raise UserError(f"{where}={plan.placed[loc].scheme} cannot run inside model={cfg.model.get('name')}: "
                            f"it {reason}")


def check_triton(plan, cfg: DictConfig) -> None:
    """``attention.impl=triton`` runs where Triton runs (CUDA; the CPU only under TRITON_INTERPRET=1, for
    tests): DNAS and HNAS in both forms, Sinkhorn-k in the encoder form (its prefix form keeps the chunked
    path: :func:`fused_notes`); no atomics, so ``trainer.deterministic=true`` takes the kernels."""
    chosen = {loc: p for loc, p in plan.placed.items() if p.options.get("impl") == "triton"}
    if not chosen:
        return
    import torch

    from nas_cli.attention.triton_prefix import triton_unavailable
    from nas_cli.attention.triton_tiles import env_prefix_tiles

    _check_fused(cfg, f"attention.impl=triton ({', '.join(chosen)})", None,
                 lambda device: triton_unavailable(torch.device(device)))
    try:
        env_prefix_tiles()
    except ValueError as err:
        raise UserError(str(err)) from None


def fused_notes(plan) -> tuple[str, ...]:
    """What a user should know about a fused ``attention.impl`` the plan asks for: the locations that
    keep the chunked exact path (same values and gradients) because the fused one cannot express them."""
    notes = []
    chosen = {loc: p for loc, p in plan.placed.items() if p.options.get("impl") == "triton"}
    other = [loc for loc, p in chosen.items() if "sinkhorn" in str(p.scheme) and loc in ("decoder", "cross")]
    if other:
        notes.append(f"attention.impl=triton covers DNAS and HNAS in both forms and Sinkhorn-k in the encoder form; "
                     f"Sinkhorn-k at {', '.join(other)} (prefix-normalized) uses the chunked exact path (same values "
                     "and gradients)")
    prefix = [loc for loc, p in plan.placed.items() if p.options.get("impl") == "flex" and loc in ("decoder", "cross")]
    if prefix:
        notes.append(f"attention.impl=flex: {', '.join(prefix)} attention is prefix-normalized (each query's column "
                     "sums run over the queries before it), which FlexAttention cannot express; "
                     f"{'it uses' if len(prefix) == 1 else 'they use'} the chunked exact path (same values and "
                     "gradients)")
    return tuple(notes)


def _check_fused(cfg: DictConfig, what: str, atomics: str | None, unavailable) -> None:
    """A fused attention path (flex, triton): refused under trainer.deterministic where its gradients
    use atomics (``atomics`` says how; None: they do not) and where it cannot run on the trainer's
    device, with one line each."""
    import torch

    if atomics and bool((cfg.get("trainer") or {}).get("deterministic", False)):
        raise UserError(f"{what} is not deterministic ({atomics}); with trainer.deterministic=true use "
                        "attention.impl=auto (the chunked exact path), or drop trainer.deterministic")
    accel = str((cfg.get("trainer") or {}).get("accelerator", "auto"))
    device = "cuda" if accel in ("gpu", "cuda") or (accel == "auto" and torch.cuda.is_available()) else "cpu"
    why = unavailable(device)
    if why:
        raise UserError(f"{what}: {why}; use attention.impl=auto (the chunked exact path, same values and "
                        "gradients) or train on a GPU (trainer=gpu)")


def check_flex(plan, cfg: DictConfig) -> None:
    """``attention.impl=flex`` trains only where FlexAttention has a backward pass (CUDA), is not
    deterministic (its captured-bias gradients are accumulated with atomics on CUDA), and takes
    only the encoder form: the prefix-normalized locations (decoder, cross-attention) keep the
    chunked path (:func:`fused_notes`)."""
    flex = [loc for loc, p in plan.placed.items() if p.options.get("impl") == "flex"]
    if not flex:
        return
    from nas_cli.attention.flex import flex_unavailable

    _check_fused(cfg, f"attention.impl=flex ({', '.join(flex)})",
                 "FlexAttention accumulates the gradients of the column normalizer with atomics on CUDA",
                 lambda device: flex_unavailable(device, training=True))
