"""``nas-eval``: decode and score a split from a finished run's checkpoint(s).

    nas-eval outputs/runs/multi30k/unas-h4/<time>                 # best checkpoint, test split
    nas-eval <run dir> --average-last 5 --beam 5 --lenpen 0.6      # average the last 5 periodic checkpoints
    nas-eval <run dir> --ckpt a.ckpt --ckpt b.ckpt --split valid   # average exactly these
    nas-eval <run dir> --eval-lengths 512,1024,2048                # also at other lengths (length generalization)
    nas-eval <run dir> --passkey                                   # a subword LM: passkey retrieval, length x depth
    nas-eval <run dir> --lm-eval piqa,hellaswag --lm-eval-data ../shared/data   # zero-shot, lm-evaluation-harness

The model and task are rebuilt from the run's saved config (``.hydra/config.yaml``);
``--set key=value`` overrides it (e.g. a new ``task.path``). Writes the metrics (and the
sacreBLEU signature) to ``<run dir>/eval/<name>.json`` and the hypotheses to
``<name>.hyp.txt``; nothing in the run is overwritten.
"""
from __future__ import annotations

import signal
from pathlib import Path

from rich.table import Table

from nas_cli.errors import OneLineParser, SignalStop, UserError, exits, fail, print_table, quiet_libraries
from nas_cli.pipeline.evaluation import evaluate


def _parser() -> OneLineParser:
    ap = OneLineParser(prog="nas-eval", description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path, help="a nas-run run directory")
    ap.add_argument("--ckpt", type=Path, action="append", help="checkpoint(s) to use (averaged if several)")
    ap.add_argument("--average-last", type=int, default=0, help="average the last N periodic checkpoints")
    ap.add_argument("--split", default="test", choices=["valid", "test"])
    ap.add_argument("--beam", type=int, help="beam size (1 = greedy); default: the task's")
    ap.add_argument("--lenpen", type=float, help="length penalty; default: the task's")
    ap.add_argument("--eval-lengths", metavar="L1,L2", help="also evaluate at these lengths in tokens (length "
                    "generalization, as nas-run's eval_lengths): metrics <split>/<metric>@<length>")
    ap.add_argument("--passkey", action="store_true", help="a subword language model (task=subword_lm): passkey "
                    "retrieval in its held-out text at each length x needle depth (eval/passkey.json, "
                    "eval/passkey_heatmap.png) instead of the split's metrics")
    ap.add_argument("--passkey-lengths", metavar="L1,L2", help="with --passkey: the lengths in tokens (default: "
                    "the trained length, 2x and 4x)")
    ap.add_argument("--passkey-samples", type=int, default=20, help="with --passkey: probes per cell (default 20)")
    ap.add_argument("--lm-eval", metavar="TASK1,TASK2", help="a subword language model: zero-shot scores from "
                    "lm-evaluation-harness (pip install -e \".[eval]\") on these tasks (eval/lm_eval.json, per-item "
                    "records beside it) instead of the split's metrics")
    ap.add_argument("--lm-eval-data", metavar="DIR", default=None, help="with --lm-eval: a folder of the tasks' local "
                    "files (lambada_openai, piqa, hellaswag, boolq; docs/zeroshot.md); default: $NAS_RUN_EVAL_DATA, "
                    "else lm-eval reads them from the Hugging Face hub")
    ap.add_argument("--lm-eval-limit", type=int, help="with --lm-eval: score only the first N items of each task")
    ap.add_argument("--lm-eval-batch-size", type=int, default=16, help="with --lm-eval: requests per batch")
    ap.add_argument("--lm-eval-max-length", type=int, help="with --lm-eval: the context in tokens (default: the "
                    "trained window; a longer context keeps its last tokens)")
    ap.add_argument("--name", help="output name under <run dir>/eval/ (default from the options)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override the saved config")
    return ap


@exits
def main(argv=None) -> None:
    args = _parser().parse_args(argv)
    quiet_libraries()
    from nas_cli.infra.fault_tolerance import stop_signals

    try:
        with stop_signals():  # a stop ends the evaluation at once; eval/ gets nothing of it
            result = evaluate(args)
    except UserError as err:
        fail(str(err), program="nas-eval")
    except SignalStop as stop:
        fail(f"{signal.Signals(stop.signum).name} during the evaluation of {args.run_dir} ({args.split} split); "
             "nothing written to its eval/", 128 + stop.signum, kind="stopped", color="yellow", program="nas-eval")
    _print(args, result)


def _print(args, result: dict) -> None:
    """The scores as a table, then the run, what was scored and the files written, each on a line."""
    title = "nas-eval: passkey retrieval (share retrieved)" if args.passkey else \
        "nas-eval: zero-shot (lm-evaluation-harness)" if args.lm_eval else f"nas-eval ({args.split} split)"
    table = Table(title=title)  # the run's path on a line of its own: never broken
    if args.lm_eval:  # lm-eval's numbers, each with its standard error and the items scored
        for name in ("task", "metric", "value", "± stderr", "items"):
            table.add_column(name, justify="left" if name in ("task", "metric") else "right")
        for k, v in result["metrics"].items():
            task, metric = k.removeprefix("test/zeroshot/").split("/", 1)
            err = result["stderr"].get(k)
            table.add_row(task, metric, f"{v:.4f}", "-" if err is None else f"{err:.4f}",
                          f"{result['tasks'][task]['items']:,}")
    else:
        table.add_column("metric")
        table.add_column("value", justify="right")
        for k, v in result["metrics"].items():
            table.add_row(k, f"{v:.4f}")
    print_table(table)
    print(f"run: {args.run_dir}")
    scored = ", ".join(result["checkpoints"])
    beam = result["decoding"]["beam"] if result.get("decoding") else None
    print(f"scored: {scored}" + (" (averaged)" if len(result["checkpoints"]) > 1 else "")
          + (f", beam {beam}" if beam else "") + f", {result['threads']} thread(s)")
    if result.get("bleu_signature"):
        print(f"sacreBLEU signature: {result['bleu_signature']}")
    print(f"written: {', '.join(result['files'])}")


if __name__ == "__main__":
    main()
