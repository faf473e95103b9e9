"""nas-run's lm-evaluation-harness model (nas_cli/zeroshot/lm.py) against lm-eval's own ``HFLM`` on the same
Hugging Face model object: the same per-item log-likelihoods, and the time each takes.

A byte-level BPE of ``--vocab-size`` is trained on ``--docs`` documents of ``../shared/data/wikipedia_en``; the
model is ``model=hf_llama`` as the preset builds it (random weights: speed and equality do not depend on
training); the tasks are the local ``--tasks`` (``../shared/data``), the first ``--limit`` items of each. Each
repeat runs lm-eval's ``simple_evaluate`` once with each model class (alternating which goes first), one
thread, the same batch size and context; reported: the median seconds of each, their ratio, and the largest
difference between the two per-item log-likelihoods.

    python benchmarks/lm_eval_speed.py     # writes docs/bench_lm_eval.json and its table in docs/benchmarks.md
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from nas_cli.bench.markdown import add_output_options, run_and_write

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"


def _task(docs: int, vocab_size: int, tmp: str):
    import json

    from tasks.documents import read_corpus
    from tasks.subword_lm import SubwordLMTask

    texts, _ = read_corpus(str(DATA / "wikipedia_en"))
    path = Path(tmp) / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:docs]))
    task = SubwordLMTask(path=str(path), vocab_size=vocab_size, tokens_per_sample=512, cache_dir=str(Path(tmp) / "c"))
    task.setup()
    return task


def _model(task):
    from hydra import compose, initialize_config_dir

    from nas_cli.hf.models import build_hf_model
    from nas_cli.model.plan import AttentionPlan

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["model=hf_llama", "task=wikitext2"])
    return build_hf_model(cfg.model, AttentionPlan.for_job(cfg).model_cores(cfg.model), task).eval(), cfg.model


def measure(tasks: list[str], limit: int, repeats: int, batch_size: int, docs: int, vocab_size: int) -> dict:
    import numpy as np
    import torch
    from lm_eval import evaluator
    from lm_eval.models.huggingface import HFLM
    from transformers import PreTrainedTokenizerFast

    from nas_cli.zeroshot.harness import _quiet
    from nas_cli.zeroshot.lm import NasLM
    from nas_cli.zeroshot.tasks import task_specs

    torch.set_num_threads(1)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="lm-eval-bench-") as tmp:
        task = _task(docs, vocab_size, tmp)
        model, options = _model(task)
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=task.tokenizer, eos_token="</s>", pad_token="<pad>")
        classes = {"nas-run": NasLM(model, task, batch_size=batch_size, max_length=512),
                   "HFLM": HFLM(pretrained=model.hf, tokenizer=tokenizer, batch_size=batch_size, max_length=512,
                                device="cpu")}
        seconds = {name: [] for name in classes}
        answers = {}
        for r in range(repeats):
            for name in (list(classes) if r % 2 == 0 else list(classes)[::-1]):
                specs, _, manager = task_specs(tasks, str(DATA))
                t0 = time.perf_counter()
                with _quiet():
                    out = evaluator.simple_evaluate(model=classes[name], tasks=specs, task_manager=manager,
                                                    limit=limit, log_samples=True, bootstrap_iters=0)
                seconds[name].append(time.perf_counter() - t0)
                answers[name] = [float(resp[0]) for t in tasks for s in sorted(out["samples"][t], key=lambda s: s["doc_id"])
                                 for resp in s["filtered_resps"]]
    gap = float(np.max(np.abs(np.array(answers["nas-run"]) - np.array(answers["HFLM"]))))
    median = {name: statistics.median(v) for name, v in seconds.items()}
    return {"tasks": tasks, "limit": limit, "requests": len(answers["HFLM"]), "repeats": repeats,
            "batch_size": batch_size, "max_length": 512, "model": {k: options[k] for k in (
                "d_model", "heads", "kv_heads", "decoder_layers", "ffn")}, "vocab_size": task.src_vocab_size,
            "cores": len(os.sched_getaffinity(0)), "seconds": seconds, "nas_run_s": median["nas-run"],
            "hflm_s": median["HFLM"], "ratio": median["nas-run"] / median["HFLM"], "max_abs_ll_difference": gap}


def table(result: dict) -> str:
    m = result["model"]
    return "\n".join([
        "## Zero-shot scoring: nas-run's lm-eval model against lm-eval's HFLM (generated)", "",
        f"`{result['command']}` on {result['machine']}, {result['date']} (one thread, {result['cores']} cores; median "
        f"of {result['repeats']}): `model=hf_llama` (d_model {m['d_model']}, {m['heads']} heads, {m['kv_heads']} "
        f"key/value heads, {m['decoder_layers']} layers, random weights), a byte-level BPE of "
        f"{result['vocab_size']:,}; the first {result['limit']} items of {', '.join(result['tasks'])} (local files): "
        f"{result['requests']:,} log-likelihood requests, batches of {result['batch_size']}, contexts up to "
        f"{result['max_length']} tokens" + (f"; {result['load']}" if result.get("load") else "") + ".", "",
        "| model class | seconds | ratio |", "|---|---:|---:|",
        f"| lm-eval's `HFLM` | {result['hflm_s']:.1f} | 1.00x |",
        f"| nas-run's `NasLM` | {result['nas_run_s']:.1f} | {result['ratio']:.2f}x |", "",
        f"Largest difference between the two per-item log-likelihoods: {result['max_abs_ll_difference']:.1e}.", ""])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="lambada_openai,piqa,hellaswag")
    p.add_argument("--limit", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--docs", type=int, default=2000, help="Wikipedia documents the BPE is trained on")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--load", default=None, help="what else ran on the machine during the measurement, said with it")
    add_output_options(p, ROOT / "docs" / "bench_lm_eval.json", ROOT / "docs" / "benchmarks.md")
    args = p.parse_args()
    names = [t for t in args.tasks.split(",") if t]
    print(table(run_and_write(args, lambda: {**measure(names, args.limit, args.repeats, args.batch_size, args.docs,
                                                       args.vocab_size), **({"load": args.load} if args.load else {})},
                              table, "python benchmarks/lm_eval_speed.py")))


if __name__ == "__main__":
    main()
