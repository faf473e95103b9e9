"""Markdown output shared by the benchmarks: one section of docs/benchmarks.md each."""
from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Callable


def num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def write_markdown(path: Path, section: str) -> None:
    """Replace (or append) our section (its heading is the section's first line);
    everything else in the file stays as it was."""
    heading = section.splitlines()[0]
    text = path.read_text() if path.is_file() else "# Benchmarks\n"
    start = text.find(heading + "\n")
    if start < 0 and text.endswith(heading):
        start = len(text) - len(heading)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        nxt = text.find("\n## ", start + len(heading))
        rest = "" if nxt < 0 else text[nxt + 1:]
        text = text[:start] + section + ("\n" + rest if rest else "")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def simulation_parser(doc: str, out: Path, markdown: Path, sweeps: int, power_sweeps: int, sweeps_help: str):
    """The command line of a simulation benchmark: --sweeps (with no true effect), --power-sweeps
    (with one) and the output options; the benchmark adds its own."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--sweeps", type=int, default=sweeps, help=sweeps_help)
    parser.add_argument("--power-sweeps", type=int, default=power_sweeps, help="simulated sweeps per cell with an effect")
    add_output_options(parser, out, markdown)
    return parser


def add_output_options(parser, out: Path, markdown: Path) -> None:
    """--out (the JSON), --markdown (the page its table goes to) and --table-only."""
    parser.add_argument("--out", default=str(out))
    parser.add_argument("--markdown", default=str(markdown))
    parser.add_argument("--table-only", action="store_true", help="rewrite the table from --out's JSON, no run")


def run_and_write(args, compute: Callable[[], dict], table: Callable[[dict], str], command: str) -> dict:
    """A simulation benchmark's main: with --table-only, the table again from --out's JSON; else
    ``compute()``, stamped with the date, seconds, machine and command, written to --out and its
    table to --markdown. Returns the result."""
    if args.table_only:
        result = json.loads(Path(args.out).read_text())
    else:
        t0 = time.time()
        result = compute()
        result.update(date=time.strftime("%Y-%m-%d"), seconds=time.time() - t0,
                      machine=f"{platform.machine()}, {platform.python_version()}", command=command)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    write_markdown(Path(args.markdown), table(result))
    return result
