"""Zero-shot evaluation of a trained nas-run language model with lm-evaluation-harness (``nas-eval RUN
--lm-eval TASKS``, or ``lm_eval.tasks=[...]`` at the end of training).

:func:`zero_shot` runs lm-eval's ``simple_evaluate`` with :class:`nas_cli.zeroshot.lm.NasLM` over the
model and the tasks of :mod:`nas_cli.zeroshot.tasks`, and returns

* ``metrics``: every number lm-eval reports per task, named ``test/zeroshot/<task>/<metric>`` (a filter other
  than lm-eval's default one is appended as ``<metric>_<filter>``) with its standard error beside it in
  ``stderr``; nas-report gives each its verdict over seeds (Holm over every zero-shot number compared);
* ``items``: per task and document, the per-item metric values lm-eval logged (``acc``, ``acc_norm``: 0/1;
  ``perplexity``: the continuation's log-likelihood), for nas-report's paired detail (McNemar for accuracy);
* ``samples``: lm-eval's own per-item records (document, requests, responses, metrics), as its
  ``--log_samples`` writes them.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time

from nas_cli.errors import UserError

#: lm-eval's per-item values nas-report reads, and the default filter whose name it leaves out
ITEM_METRICS = ("acc", "acc_norm", "perplexity")
DEFAULT_FILTER = "none"
#: the bootstrap that gives lm-eval's standard errors of non-mean aggregations (LAMBADA's perplexity)
BOOTSTRAP_ITERS = 1000


def require_lm_eval(option: str = "--lm-eval") -> None:
    """One line naming the extra when lm-evaluation-harness is not installed."""
    try:
        import lm_eval  # noqa: F401
        import accelerate  # noqa: F401 - lm-eval's Hugging Face model code imports it
    except ImportError as err:
        raise UserError(f"{option} needs lm-evaluation-harness ({err.name} is not installed): "
                        "pip install -e \".[eval]\" (or pip install lm-eval accelerate)") from None


def metric_name(task: str, key: str) -> str:
    """lm-eval's ``acc,none`` of ``piqa`` -> ``test/zeroshot/piqa/acc``."""
    metric, _, flt = key.partition(",")
    return f"test/zeroshot/{task}/{metric}" + (f"_{flt}" if flt and flt != DEFAULT_FILTER else "")


def check_model(task, model) -> None:
    if not hasattr(task, "tokenizer") or getattr(task, "kind", None) != "lm":
        raise UserError(f"--lm-eval scores a language model trained on text with a subword tokenizer "
                        f"(task=subword_lm); task '{getattr(task, 'name', '?')}' is not one")
    if not hasattr(model, "output_logits") and not getattr(model, "adaptive", False):
        raise UserError("--lm-eval: this model has no output layer to score with (a task's read-out replaces it)")


def zero_shot(model, task, names: list[str], data_dir: str | None = None, limit: int | None = None,
              batch_size: int = 16, max_length: int | None = None, seed: int = 1234) -> dict:
    """lm-eval's zero-shot scores of ``model`` (see the module's docstring for what is returned)."""
    require_lm_eval()
    check_model(task, model)
    from lm_eval import evaluator

    from nas_cli.zeroshot.lm import NasLM
    from nas_cli.zeroshot.tasks import items_digest, task_specs

    if limit is not None and limit < 1:
        raise UserError(f"--lm-eval-limit {limit}: give the number of items per task to score (at least 1), or "
                        "leave it out for every item")
    specs, sources, manager = task_specs(names, data_dir)
    lm = NasLM(model, task, batch_size=batch_size, max_length=max_length)
    t0 = time.perf_counter()
    try:
        with _quiet():
            out = evaluator.simple_evaluate(model=lm, tasks=specs, task_manager=manager, limit=limit,
                                            log_samples=True, bootstrap_iters=BOOTSTRAP_ITERS, random_seed=seed,
                                            numpy_random_seed=seed, torch_random_seed=seed,
                                            fewshot_random_seed=seed)
    except (ConnectionError, OSError) as err:  # the hub, unreachable or without the files
        raise UserError(f"--lm-eval: lm-eval could not read a task's data ({str(err).splitlines()[0][:160]}); "
                        "with no network give local copies with --lm-eval-data DIR") from None
    seconds = time.perf_counter() - t0
    metrics, stderr = {}, {}
    for name in names:
        for key, value in (out["results"].get(name) or {}).items():
            if key in ("alias", "sample_len") or not isinstance(value, (int, float)) or "_stderr," in key:
                continue
            metrics[metric_name(name, key)] = float(value)
            err = out["results"][name].get(key.replace(",", "_stderr,", 1))
            stderr[metric_name(name, key)] = float(err) if isinstance(err, (int, float)) and math.isfinite(err) \
                else None
    samples = {name: out["samples"].get(name, []) for name in names}
    return {"metrics": metrics, "stderr": stderr, "items": _items(samples), "samples": samples,
            "tasks": {name: {"items": len(samples[name]), "documents": sources[name],
                             "version": (out.get("versions") or {}).get(name),
                             "higher_is_better": (out.get("higher_is_better") or {}).get(name)} for name in names},
            "items_sha256": items_digest(names, data_dir, limit), "limit": limit, "max_length": lm.max_length,
            "lm_eval_version": _version(), "seconds": seconds}


@contextlib.contextmanager
def _quiet():
    """lm-eval's run without its progress bars, prints and info logs (nas-eval prints the scores), without
    its ``git describe`` of the working directory (git's complaint outside a repository would reach the
    terminal; the record names lm-eval's version instead), and with its bootstrap standard errors (LAMBADA's
    perplexity) computed in this process (``DISABLE_MULTIPROC``): its process pool of one task per CPU can start
    a worker while the pool is being shut down, which then waits for ever on the pool's lock and, outliving
    nas-run, keeps its output pipes open (a caller reading them never returns)."""
    import io
    from unittest import mock

    import lm_eval.evaluator
    import lm_eval.loggers.utils

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            mock.patch.object(lm_eval.evaluator, "get_git_commit_hash", lambda: None), \
            mock.patch.object(lm_eval.loggers.utils, "get_git_commit_hash", lambda: None), \
            mock.patch.dict(os.environ, {"DISABLE_MULTIPROC": "1"}):
        yield


def _items(samples: dict[str, list[dict]]) -> dict[str, dict[str, list]]:
    """{task: {"doc_id": [...], metric: [per-item value]}} in document order."""
    out = {}
    for name, records in samples.items():
        records = sorted(records, key=lambda r: r["doc_id"])
        found = {"doc_id": [int(r["doc_id"]) for r in records]}
        for metric in ITEM_METRICS:
            if records and all(isinstance(r.get(metric), (int, float, bool)) for r in records):
                found[metric] = [float(r[metric]) for r in records]
        out[name] = found
    return out


def _version() -> str:
    from importlib.metadata import version

    return version("lm_eval")


def requested(cfg) -> list[str]:
    """The zero-shot tasks a run's config asks for at the end of training (``lm_eval.tasks``), or []."""
    block = cfg.get("lm_eval") or {}
    tasks = block.get("tasks")
    if tasks is None:
        return []
    if isinstance(tasks, str):
        from nas_cli.zeroshot.tasks import parse_names

        return parse_names(tasks)
    return [str(t) for t in tasks]


def check_config(cfg, task) -> None:
    """Before training: ``lm_eval.tasks`` asks of a subword language model, lm-eval is installed, and every
    task is known and (with ``lm_eval.data_dir``) has its local files; one line otherwise."""
    names = requested(cfg)
    if not names:
        return
    require_lm_eval("lm_eval.tasks")
    if task is not None and not hasattr(task, "tokenizer_file"):
        raise UserError(f"lm_eval.tasks scores a language model trained on text with a subword tokenizer "
                        f"(task=subword_lm); task '{task.name}' is not one: leave lm_eval.tasks out")
    from nas_cli.zeroshot.tasks import task_specs

    block = cfg.lm_eval
    if block.get("limit") is not None and int(block.limit) < 1:
        raise UserError(f"lm_eval.limit={block.limit}: give the number of items per task (at least 1), or null")
    try:
        task_specs(names, block.get("data_dir"))
    except UserError as err:
        raise UserError(str(err).replace("--lm-eval-data", "lm_eval.data_dir").replace("--lm-eval", "lm_eval.tasks")
                        .replace("leave lm_eval.data_dir out", "set lm_eval.data_dir=null")) from None


def at_end_of_training(cfg, run_dir, module, task, logger) -> dict | None:
    """``lm_eval.tasks``: the tested weights' zero-shot scores, written as ``nas-eval --lm-eval`` writes them
    (``eval/lm_eval.json`` and beside it) and logged to the run's W&B run as a table."""
    names = requested(cfg)
    if not names:
        return None
    import torch

    from nas_cli.zeroshot import record

    block = cfg.lm_eval
    say = bool(cfg.get("progress_lines", True))
    t0 = time.perf_counter()
    if say:
        print(f"nas-run: {run_dir.name}: zero-shot evaluation with lm-evaluation-harness: {', '.join(names)}"
              + (f" (the first {block.limit} items of each)" if block.get("limit") else ""), flush=True)
    try:
        result = zero_shot(module.model, task, names, block.get("data_dir"), block.get("limit"),
                           int(block.get("batch_size") or 16), block.get("max_length"))
        files = record.write(run_dir / "eval", record.NAME, result, ["tested weights"], torch.get_num_threads())
    except Exception as err:  # noqa: BLE001 - the trained and tested run stays finished; the scores can be redone
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"nas-run: warning: the zero-shot evaluation failed ({reason}); the run is finished without it: "
              f"nas-eval {run_dir} --lm-eval {','.join(names)} scores it again", file=sys.stderr)
        return {"error": reason}
    record.log_table(logger, result)
    if say:
        print(f"nas-run: {run_dir.name}: zero-shot evaluation: done in {time.perf_counter() - t0:,.0f} s "
              f"({files[0].relative_to(run_dir)})", flush=True)
    return {"file": str(files[0].relative_to(run_dir)), "metrics": result["metrics"]}
