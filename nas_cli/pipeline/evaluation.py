"""Evaluation of a finished run (``nas-eval``): its checkpoints, averaged or not, rebuilt with the run's
own config and scored on a split; the result goes to ``<run dir>/eval/``, nothing in the run is
overwritten."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from omegaconf import OmegaConf

from nas_cli.errors import UserError


def average_checkpoints(paths: list[Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean of the ``state_dict`` of several checkpoints (Vaswani et al. 2017).

    Loaded with ``weights_only=True``; integer buffers are taken from the last checkpoint."""
    if not paths:
        raise UserError("no checkpoints to average")
    total: dict[str, torch.Tensor] = {}
    for p in paths:
        try:
            state = torch.load(p, map_location="cpu", weights_only=True)["state_dict"]
        except Exception as err:  # a truncated or foreign file: say which
            raise UserError(f"cannot read checkpoint {p}: {_unreadable(p, err)}") from None
        if total and set(state) != set(total):
            raise UserError(f"checkpoint {p} does not match the others (different parameters)")
        for key, val in state.items():
            if val.is_floating_point():
                total[key] = total.get(key, 0) + val.double()
            else:
                total[key] = val
    return {k: (v / len(paths)).to(torch.float32) if v.is_floating_point() else v for k, v in total.items()}


def _unreadable(path: Path, err: Exception) -> str:
    """Why a checkpoint did not load, in our words: PyTorch's own message for the safe loader's
    refusal advises loading with ``weights_only=False``, which runs arbitrary code from a file of
    unknown origin; nas-eval never does that."""
    import zipfile

    text = str(err)
    if "Weights only load failed" not in text:
        return text.splitlines()[0] if text else type(err).__name__
    if not zipfile.is_zipfile(path):
        return "not a PyTorch checkpoint (not a file written by torch.save); give a .ckpt from a run's checkpoints/"
    return ("it holds objects other than tensors and plain values, so it was not written by nas-run; nas-eval "
            "loads checkpoints only with PyTorch's safe loader and will not run code from the file")


def check_fingerprints(cfg, paths: list[Path]) -> None:
    """Refuse checkpoints made with another model/attention/task/seed than the config rebuilt here
    (a run directory whose config was replaced, or ``--ckpt`` from another run)."""
    from nas_cli.infra.resume import fault_tolerance_state, config_fingerprint, load_safe

    want = config_fingerprint(cfg)
    for p in paths:
        try:
            got = fault_tolerance_state(load_safe(p)).get("config")
        except Exception:  # noqa: BLE001 - unreadable: average_checkpoints says so
            continue
        if got and got != want:
            raise UserError(f"checkpoint {p} was trained with another configuration than this run's "
                            ".hydra/config.yaml (with --set) describes (model, attention, task or seed differ); "
                            "evaluate it from its own run directory")


def periodic_checkpoints(run_dir: Path) -> list[Path]:
    """Periodic checkpoints ``step<N>.ckpt`` of a run, oldest first."""
    found = sorted((run_dir / "checkpoints").glob("step*.ckpt"), key=lambda p: int("".join(filter(str.isdigit, p.stem))))
    return found


_MISSING = object()


def evaluate(args) -> dict:
    """Evaluate a finished run's checkpoint(s) on a split, with the run's own config (``--set``
    changes, ``--beam``/``--lenpen``); the result goes to ``<run>/eval/<name>.json``, its metrics
    named by the split (``valid/loss``, ``test/bleu``). Threads as nas-run chooses them (``--set
    threads=N``, else by the model's size); progress as lines where stdout is not a terminal."""
    import pytorch_lightning as pl

    from nas_cli.model.plan import AttentionPlan
    from nas_cli.pipeline.lit import count_parameters
    from nas_cli.pipeline.progress import progress_callback
    from nas_cli.pipeline.launch.resolvers import register_resolvers
    from nas_cli.pipeline.lengths import lengths_record, test_at_lengths
    from nas_cli.pipeline.parts import build_module, build_task
    from nas_cli.pipeline.trainer import set_threads

    register_resolvers()  # the saved config's ${nas.*} interpolations
    run_dir = args.run_dir
    cfg = _run_config(run_dir, args.set)
    ckpts = _checkpoints(args, run_dir)
    check_fingerprints(cfg, ckpts)
    task = build_task(cfg)
    lengths = eval_lengths(cfg, task, getattr(args, "eval_lengths", None))
    _set_decoding(task, args.beam, args.lenpen)
    module = build_module(cfg, task, AttentionPlan.from_config(cfg.attention).model_cores(cfg.model))
    module.load_state_dict(average_checkpoints(ckpts))
    module.test_split = args.split
    set_threads(cfg, count_parameters(module.model))
    if getattr(args, "passkey", False):
        return _passkey(args, run_dir, task, module, ckpts)
    if getattr(args, "lm_eval", None):
        return _zero_shot(args, cfg, run_dir, task, module, ckpts)
    trainer = pl.Trainer(accelerator=cfg.trainer.get("accelerator", "auto"), devices=1, logger=False,
                         callbacks=[progress_callback(run_dir.name, "", False, program="nas-eval")],
                         enable_model_summary=False, enable_checkpointing=False)
    loader = task.test_dataloader() if args.split == "test" else task.val_dataloader()
    metrics = trainer.test(module, dataloaders=loader, verbose=False)[0]
    metrics.update(test_at_lengths(trainer, module, task, lengths, None, args.split))
    name = args.name or f"{args.split}" + (f"-avg{len(ckpts)}" if len(ckpts) > 1 else "") + \
        (f"-beam{args.beam}" if args.beam else "") + (f"-lenpen{args.lenpen}" if args.lenpen is not None else "") + \
        ("-at" + "-".join(map(str, lengths)) if lengths else "")
    result = {"split": args.split, "checkpoints": [str(p) for p in ckpts], "metrics": metrics,
              "decoding": task.decoding, "bleu_signature": task.bleu_signature, "threads": torch.get_num_threads(),
              "lengths": lengths_record(task, lengths)}
    result["files"] = [str(p) for p in _write(run_dir / "eval", name, result, module.items.get(args.split),
                                              module.decoded.get(args.split, []))]
    return result


def _passkey(args, run_dir: Path, task, module, ckpts) -> dict:
    """``--passkey``: the length x depth grid of passkey retrieval in the run's held-out text
    (nas_cli/pipeline/passkey.py), written to ``eval/passkey.json`` and drawn in ``eval/passkey_heatmap.png``."""
    import numpy as np

    from nas_cli.infra.atomic import atomic_write_json
    from nas_cli.pipeline.lengths import draw_heatmap
    from nas_cli.pipeline.passkey import grid_metrics, passkey_grid

    trained = task.trained_length() or 256
    try:
        lengths = [int(v) for v in str(args.passkey_lengths).split(",")] if args.passkey_lengths else \
            [trained, 2 * trained, 4 * trained]
    except ValueError:
        raise UserError(f"--passkey-lengths {args.passkey_lengths}: give lengths in tokens separated by commas "
                        "(e.g. --passkey-lengths 256,512,1024)") from None
    if any(n < 32 for n in lengths) or args.passkey_samples < 1:
        raise UserError("--passkey-lengths must be at least 32 tokens each and --passkey-samples at least 1")
    grid = passkey_grid(module.model, task, lengths, samples=args.passkey_samples)
    metrics, declared, per_probe = grid_metrics(grid)
    out = run_dir / "eval"
    out.mkdir(exist_ok=True)
    result = {"split": "test", "checkpoints": [str(p) for p in ckpts], "passkey": grid,
              "threads": torch.get_num_threads(), "decoding": None, "bleu_signature": None,
              "metrics": metrics, "declared": declared}
    picture = draw_heatmap(out / "passkey_heatmap.png", grid["lengths"], [f"{int(d)}" for d in grid["depths"]],
                           np.array(grid["accuracy"]).T, f"passkey retrieval: {run_dir.name}", "retrieved (%)")
    items = atomic_write_json(out / "passkey.items.json", {"split": "test", "refs_sha256": grid["probes_sha256"],
                                                           "passkey": per_probe}, indent=None)
    result["files"] = [str(atomic_write_json(out / "passkey.json", {k: v for k, v in result.items()})), str(items),
                       str(picture)]
    return result


def _zero_shot(args, cfg, run_dir: Path, task, module, ckpts) -> dict:
    """``--lm-eval``: lm-evaluation-harness's zero-shot scores (nas_cli/zeroshot/), written to
    ``eval/<name>.json`` (default ``lm_eval``), its per-item values and lm-eval's records beside it."""
    import os

    from nas_cli.zeroshot import record
    from nas_cli.zeroshot.harness import zero_shot
    from nas_cli.zeroshot.tasks import parse_names

    if args.split != "test":
        raise UserError("--lm-eval scores the tasks' own items, not a split of the run's data: leave --split out")
    if args.lm_eval_batch_size < 1:
        raise UserError(f"--lm-eval-batch-size {args.lm_eval_batch_size}: give at least 1")
    max_length, reach = args.lm_eval_max_length, int(cfg.model.get("max_len") or 0) or None
    if reach and cfg.model.get("positions") == "learned":  # rows past the trained window were never trained
        reach = min(reach, task.trained_length() or reach)
    if max_length is not None and (max_length < 2 or (reach and max_length > reach)):
        raise UserError(f"--lm-eval-max-length {max_length}: give 2 to {reach} tokens (the model's positions reach "
                        f"{reach}: model.max_len, and the trained window for learned positions)")
    result = zero_shot(module.model, task, parse_names(args.lm_eval), args.lm_eval_data or
                       os.environ.get("NAS_RUN_EVAL_DATA") or None, args.lm_eval_limit, args.lm_eval_batch_size,
                       max_length)
    files = record.write(run_dir / "eval", args.name or record.NAME, result, [str(p) for p in ckpts],
                         torch.get_num_threads())
    return {"metrics": result["metrics"], "stderr": result["stderr"], "tasks": result["tasks"],
            "checkpoints": [str(p) for p in ckpts], "decoding": None,
            "threads": torch.get_num_threads(), "bleu_signature": None, "files": [str(p) for p in files]}


def _write(out_dir: Path, name: str, result: dict, items: dict | None, hyps: list[str]) -> list[Path]:
    """The evaluation's files, each written whole (temporary file, then rename), the result last: a stop
    while writing removes the ones already written, so ``eval/`` never holds part of an evaluation."""
    from nas_cli.infra.atomic import atomic_write_json, atomic_write_text

    written: list[Path] = []
    out_dir.mkdir(exist_ok=True)
    try:
        if items is not None:  # per-item outputs: nas-report can test this evaluation against others
            written.append(atomic_write_json(out_dir / f"{name}.items.json", {**items, "split": result["split"]},
                                             indent=None))
        if hyps:
            written.append(atomic_write_text(out_dir / f"{name}.hyp.txt", "\n".join(hyps) + "\n"))
        written.insert(0, atomic_write_json(out_dir / f"{name}.json", result))
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    return written


def _run_config(run_dir: Path, sets: list[str]):
    """The run's saved config with the ``--set KEY=VALUE`` changes (``+KEY``: a new key on
    purpose; a key the config lacks is a typo, named with the closest one)."""
    cfg_path = run_dir / ".hydra" / "config.yaml"
    if not cfg_path.is_file():
        raise UserError(f"{run_dir} is not a nas-run run directory (no .hydra/config.yaml)")
    cfg = OmegaConf.load(cfg_path)
    added = [item[1:] for item in sets if item.startswith("+")]
    for item in (i for i in sets if not i.startswith("+")):
        key = item.split("=", 1)[0].strip()
        if "=" not in item or not key:
            raise UserError(f"--set {item}: expected KEY=VALUE, e.g. --set task.path=data/wmt14")
        if OmegaConf.select(cfg, key, default=_MISSING) is _MISSING:
            import difflib

            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
            names = [str(k) for k in node.keys()] if hasattr(node, "keys") else []
            close = difflib.get_close_matches(leaf, names, n=1, cutoff=0.6)
            hint = f"; did you mean {parent + '.' if parent else ''}{close[0]}?" if close else ""
            raise UserError(f"--set {key}: this run's config has no such key{hint} (to add one on purpose, "
                            f"write --set +{key}=...)")
    try:
        cfg.merge_with(OmegaConf.from_dotlist([i for i in sets if not i.startswith("+")] + added))
    except Exception as err:
        raise UserError(f"bad --set value: {err}") from None
    return cfg


def _checkpoints(args, run_dir: Path) -> list[Path]:
    """--ckpt, the last N periodic checkpoints (--average-last), or the best one."""
    if args.ckpt:
        ckpts = list(args.ckpt)
    elif args.average_last:
        ckpts = periodic_checkpoints(run_dir)[-args.average_last:]
        if len(ckpts) < args.average_last:
            raise UserError(f"--average-last {args.average_last}: only {len(ckpts)} periodic checkpoints in "
                            f"{run_dir / 'checkpoints'} (train with checkpoint.every_n_steps=N)")
    else:
        ckpts = [run_dir / "checkpoints" / "best.ckpt"]
        _check_finished(run_dir, ckpts[0])
    for p in ckpts:
        if not Path(p).is_file():
            raise UserError(f"checkpoint {p} not found")
    return [Path(p) for p in ckpts]


def _check_finished(run_dir: Path, best: Path) -> None:
    """Without --ckpt nas-eval evaluates a finished run's best checkpoint: a failed or unfinished run
    is named as such, with what to do, rather than as a missing file. A finished run stays finished when
    a later attempt to train it longer failed (its failed.json lies beside the summary)."""
    last = run_dir / "checkpoints" / "last.ckpt"
    hint = f"; evaluate a checkpoint it has with --ckpt {last}" if last.is_file() else ""
    failed = run_dir / "failed.json"
    if failed.is_file() and not (run_dir / "summary.json").is_file():
        try:
            reason = json.loads(failed.read_text()).get("reason", "?")
        except (OSError, ValueError, AttributeError):
            reason = "?"
        raise UserError(f"{run_dir} is a failed run (failed.json: {reason}){hint}")
    if not (run_dir / "summary.json").is_file():
        raise UserError(f"{run_dir} is unfinished (no summary.json): continue it with nas-run resume={run_dir}{hint}")
    if not best.is_file():
        raise UserError(f"{run_dir} has no best checkpoint ({best.name}: no validation ran or it was removed){hint}")


def _set_decoding(task, beam: int | None, lenpen: float | None) -> None:
    if beam is None and lenpen is None:
        return
    if task.kind != "seq2seq":
        raise UserError(f"task '{task.name}' is a language model: --beam/--lenpen apply to tasks that decode "
                        "with the encoder-decoder (translation, the synthetic seq2seq tasks)")
    if beam is not None and beam < 1:
        raise UserError(f"--beam {beam}: the beam size must be at least 1 (1 = greedy)")
    if task.decoding is None:  # a greedy-decoding task (reverse, sort, ...): the same search, wider
        task.decoding = {"beam": 1, "lenpen": 1.0}
    if beam is not None:
        task.decoding["beam"] = task.valid_beam = beam
    if lenpen is not None:
        task.decoding["lenpen"] = lenpen


def eval_lengths(cfg, task, given: str | None) -> list[int]:
    """``--eval-lengths 512,1024``: the lengths to evaluate at besides the trained one, checked as
    nas-run checks its ``eval_lengths`` (nas_cli/pipeline/lengths.py); [] when not given."""
    from omegaconf import OmegaConf, open_dict

    from nas_cli.pipeline.lengths import check_eval_lengths, requested

    if not given:
        return []
    try:
        values = [int(v) for v in str(given).split(",") if v.strip()]
    except ValueError:
        raise UserError(f"--eval-lengths {given}: give lengths in tokens separated by commas (e.g. "
                        "--eval-lengths 512,1024)") from None
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    with open_dict(cfg):
        cfg.eval_lengths, cfg.run_test = values, True
    try:
        check_eval_lengths(cfg, task)
    except UserError as err:  # nas-run's words for its option, said in nas-eval's
        shown = "[" + ",".join(str(v) for v in values) + "]"
        text = (str(err).replace(f"eval_lengths={shown}", f"--eval-lengths {given}")
                .replace("(e.g. eval_lengths=[256,512,1024]), or null for none", "(e.g. --eval-lengths 512,1024)")
                .replace("leave eval_lengths out", "leave --eval-lengths out"))
        raise UserError(text) from None
    return requested(cfg)
