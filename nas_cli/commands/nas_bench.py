"""``nas-bench``: benchmarks, the GPU check and the scheme contract (``attention``, ``train``,
``gpu-check``, ``check-scheme``);
argument parsing only, the measurements live in :mod:`nas_cli.bench`."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


from nas_cli.errors import OneLineParser, exits
from nas_cli.bench.attention import DEFAULT_SCHEMES, DTYPES, attention_main
from nas_cli.bench.train import TRAIN_DEFAULT_SCHEMES, TRAIN_PRECISIONS, train_main

def _csv(kind):
    def parse(text: str) -> list:
        try:
            items = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {kind.__name__}, got {text!r}")
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        return items

    return parse


def _positive(kind):
    def parse(text: str):
        try:
            x = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
        if x <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return x

    return parse


def make_parser() -> argparse.ArgumentParser:
    from nas_cli.bench.gpucheck import add_parser as add_gpu_check

    parser = OneLineParser(prog="nas-bench", description="Micro-benchmarks of nas-run components.")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_attention(sub)
    add_gpu_check(sub)
    _add_train(sub)
    _add_check_scheme(sub)
    return parser


def _add_attention(sub) -> None:
    att = sub.add_parser(
        "attention", help="forward+backward time and peak memory of the attention cores",
        description="Time and peak memory of forward+backward per attention scheme, length and causal setting, "
                    "with ratios to UNAS (fused SDPA).")
    att.add_argument("--schemes", type=_csv(str), default=DEFAULT_SCHEMES,
                     help=f"comma-separated; names in conf/attention/ or <name>-naive (default: {','.join(DEFAULT_SCHEMES)})")
    att.add_argument("--lengths", type=_csv(_positive(int)), default=[256, 512, 1024],
                     help="comma-separated sequence lengths S (default: 256,512,1024)")
    att.add_argument("--heads", type=_positive(int), default=8)
    att.add_argument("--d-head", type=_positive(int), default=64)
    att.add_argument("--batch", type=_positive(int), default=1)
    att.add_argument("--causal", choices=["off", "on", "both"], default="off",
                     help="off: encoder self-attention; on: causal decoder self-attention; both")
    att.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    att.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (cuda if available)")
    att.add_argument("--repeats", type=_positive(int), default=5)
    att.add_argument("--warmup", type=int, default=1)
    att.add_argument("--max-seconds", type=_positive(float), default=60.0,
                     help="a case whose first forward+backward takes longer is recorded as too_slow")
    att.add_argument("--isolate", action="store_true", help="run every case in a fresh subprocess")
    att.add_argument("--threads", type=_positive(int), default=None,
                     help="torch CPU threads (default: torch's choice); 1 avoids OpenMP oversubscription on "
                          "shared machines")
    att.add_argument("--out-json", type=Path, default=Path("docs/bench_attention.json"))
    att.add_argument("--out-md", type=Path, default=Path("docs/benchmarks.md"))
    att.set_defaults(subparser=att)  # option errors name the subcommand


def _add_train(sub) -> None:
    tr = sub.add_parser(
        "train", help="end-to-end training throughput: nas-run's model and loop vs a plain torch.nn.Transformer loop",
        description="Training tokens/s of nas-run (NasLitModule + Lightning Trainer) per attention scheme and of "
                    "a plain PyTorch loop over torch.nn.Transformer with the same sizes, batches, optimizer and "
                    "loss, with time ratios and the targets of docs/benchmarks.md.")
    tr.add_argument("--model", default="base", help="a model config in conf/model/ (tiny, small, base, ...; "
                                                    "default: base)")
    tr.add_argument("--src-len", type=_csv(_positive(int)), default=[128],
                    help="comma-separated source lengths (default: 128)")
    tr.add_argument("--tgt-len", type=_csv(_positive(int)), default=None,
                    help="target lengths: one for all, or one per --src-len (default: = --src-len)")
    tr.add_argument("--batch", type=_positive(int), default=8)
    tr.add_argument("--vocab", type=_positive(int), default=10000,
                    help="joint vocabulary size (default: 10000)")
    tr.add_argument("--steps", type=_positive(int), default=5, help="timed steps per repeat (default: 5)")
    tr.add_argument("--warmup-steps", type=int, default=1,
                    help="untimed steps at the start of each repeat (default: 1)")
    tr.add_argument("--repeats", type=_positive(int), default=3)
    tr.add_argument("--schemes", type=_csv(str), default=TRAIN_DEFAULT_SCHEMES,
                    help="comma-separated; names in conf/attention/, or <name>-naive|efficient|auto|flex|triton "
                         "for the schemes with an impl option, each optionally followed by @<location>[+<location>] "
                         "for those locations only, UNAS elsewhere (e.g. dnas@encoder) "
                         f"(default: {','.join(TRAIN_DEFAULT_SCHEMES)}; unas always runs)")
    tr.add_argument("--precision", choices=TRAIN_PRECISIONS, default="32-true",
                    help="32-true, or bf16-mixed (autocast in both loops)")
    tr.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    tr.add_argument("--threads", type=_positive(int), default=None,
                    help="torch CPU threads (default: torch's choice)")
    tr.add_argument("--seed", type=int, default=1)
    tr.add_argument("--out-json", type=Path, default=None,
                    help="default: docs/bench_train.json (CPU, 32-true), else docs/bench_train_<device>_<precision>.json")
    tr.add_argument("--out-md", type=Path, default=Path("docs/benchmarks.md"))
    tr.set_defaults(subparser=tr)


def _add_check_scheme(sub) -> None:
    cs = sub.add_parser(
        "check-scheme", help="put a scheme (its YAML, e.g. my_conf/attention/x.yaml) through the attention contract",
        description="Run the contract checks every packaged scheme passes (shapes, rows summing to 1, gradients, "
                    "padding invariance, no causal leak) on one scheme's YAML; its _target_ must be importable "
                    "(e.g. PYTHONPATH=.). Exit 1 if a check fails.")
    cs.add_argument("yaml", type=Path, help="the scheme's YAML file")
    cs.set_defaults(subparser=cs)


@exits
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.command == "attention":
        return attention_main(args, args.subparser, argv)
    if args.command == "gpu-check":
        from nas_cli.bench.gpucheck import main as gpu_check

        return gpu_check(args)
    if args.command == "train":
        return train_main(args, args.subparser, argv)
    if args.command == "check-scheme":
        return check_scheme_main(args)
    parser.error(f"unknown command {args.command}")  # pragma: no cover - argparse rejects it first
    return 2


def check_scheme_main(args) -> int:
    """``nas-bench check-scheme <yaml>``: one line per check; exit 1 if any failed, 2 on bad input."""
    from hydra.errors import InstantiationException
    from omegaconf.errors import OmegaConfBaseException

    from nas_cli.attention import SchemeError
    from nas_cli.model.contract import check_scheme

    if not args.yaml.is_file():
        print(f"nas-bench check-scheme: {args.yaml}: no such file; give the scheme's YAML "
              "(e.g. my_conf/attention/<name>.yaml)", file=sys.stderr)
        return 2
    try:
        results = check_scheme(args.yaml)
    except (InstantiationException, OmegaConfBaseException, SchemeError, ImportError, TypeError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"nas-bench check-scheme: {args.yaml}: the scheme cannot be built ({first}); check its _target_ "
              "and options, and that its module is importable (PYTHONPATH)", file=sys.stderr)
        return 2
    for name, result in results:
        print(f"{name:18s} {result}")
    failed = [name for name, result in results if result.startswith("FAILED")]
    print(f"{args.yaml}: {len(results) - len(failed)} of {len(results)} checks passed or do not apply"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

