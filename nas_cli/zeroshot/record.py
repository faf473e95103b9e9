"""Where a zero-shot evaluation goes: ``<run>/eval/<name>.json`` (the scores, their standard errors, the
tasks' documents and versions: an evaluation nas-report reads as a row of its own, ``eval:<name>``),
``<name>.items.json`` (per-item values for nas-report's paired detail) and ``<name>.samples/<task>.jsonl``
(lm-eval's own per-item records); and, at the end of training, a table in the run's W&B run."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

#: the default name of a zero-shot evaluation under eval/
NAME = "lm_eval"


def declared(result: dict) -> dict[str, list]:
    """summary.json-style declarations of the zero-shot metrics (title, higher is better, format), from the
    directions lm-eval gives (tasks.scores.declare reads them)."""
    out = {}
    for key in result["metrics"]:
        task, metric = key.removeprefix("test/zeroshot/").split("/", 1)
        higher = ((result["tasks"].get(task) or {}).get("higher_is_better") or {}).get(metric.split("_none")[0])
        share = metric.startswith("acc")
        out[key] = [f"{task} {metric}", higher if isinstance(higher, bool) else None, "pct" if share else "p3"]
    return out


def write(out_dir: Path, name: str, result: dict, checkpoints: list[str], threads: int) -> list[Path]:
    """The evaluation's files, each written whole, the result last; a failure removes what was written, so
    ``eval/`` never holds part of one."""
    from nas_cli.infra.atomic import atomic_write_json, atomic_write_text

    record = {"split": "test", "checkpoints": checkpoints, "metrics": result["metrics"], "stderr": result["stderr"],
              "declared": declared(result), "zero_shot": {k: result[k] for k in (
                  "tasks", "limit", "max_length", "lm_eval_version", "seconds", "items_sha256")},
              "threads": threads, "decoding": None, "bleu_signature": None}
    samples = out_dir / f"{name}.samples"
    written: list[Path] = []
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        written.append(atomic_write_json(out_dir / f"{name}.items.json", {
            "split": "test", "refs_sha256": result["items_sha256"], "zeroshot": result["items"]}, indent=None))
        for task, records in result["samples"].items():
            lines = "".join(json.dumps(r, default=str, ensure_ascii=False) + "\n" for r in records)
            written.append(atomic_write_text(samples / f"{task}.jsonl", lines))
        written.insert(0, atomic_write_json(out_dir / f"{name}.json", record))
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        shutil.rmtree(samples, ignore_errors=True) if not any(samples.glob("*")) else None
        raise
    return written


def log_table(logger, result: dict) -> None:
    """The scores as a W&B table (task, metric, value, standard error) and in the run's summary."""
    from nas_cli.infra.loggers import wandb_run_id

    if not logger or not wandb_run_id(logger):
        return
    import wandb

    run = logger.experiment
    rows = [[*k.removeprefix("test/zeroshot/").split("/", 1), v, result["stderr"].get(k)]
            for k, v in result["metrics"].items()]
    run.log({"zeroshot": wandb.Table(columns=["task", "metric", "value", "stderr"], data=rows)})
    for k, v in result["metrics"].items():
        run.summary[k] = v
