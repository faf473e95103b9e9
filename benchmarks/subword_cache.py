"""The subword token cache (task=subword_lm) against HF ``tokenizers``' own batch encoding of the same text.

On ``../shared/data/wikipedia_en`` (or ``--path``): the documents are read once; a byte-level BPE of
``--vocab-size`` is trained once; then, best of ``--repeats``:

* ``hf_encode_s``: ``Tokenizer.encode_batch`` over every document (the library's parallel encoding alone);
* ``cache_write_s``: nas-run's tokenization of the three splits into the cache (the same batch encoding,
  each token's byte count, the document boundaries, the files written);
* ``cache_read_s``: a second task's ``setup()`` with the cache in place (reading the corpus to fingerprint
  it included).

    python benchmarks/subword_cache.py      # writes docs/bench_subword.json and its table in docs/benchmarks.md
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from nas_cli.bench.markdown import add_output_options, run_and_write

ROOT = Path(__file__).resolve().parent.parent


def measure(path: str, vocab_size: int, repeats: int) -> dict:
    from tasks.documents import read_corpus
    from tasks.subword_lm import SubwordLMTask, held_out, train_bpe

    docs, _ = read_corpus(path)
    tok = train_bpe([docs[i] for i in held_out(len(docs), 0.01, 0.01, 1234)["train"]], vocab_size)
    hf = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        encoded = tok.encode_batch(docs)
        hf.append(time.perf_counter() - t0)
    tokens = sum(len(e.ids) for e in encoded)
    writes, reads = [], []
    splits = held_out(len(docs), 0.01, 0.01, 1234)
    with tempfile.TemporaryDirectory(prefix="subword-bench-") as tmp:
        for i in range(repeats):
            task = SubwordLMTask(path=path, vocab_size=vocab_size, cache_dir=str(Path(tmp) / "unused"))
            task.tokenizer = tok
            t0 = time.perf_counter()
            task._write_cache(Path(tmp) / f"write{i}", docs, splits)
            writes.append(time.perf_counter() - t0)
        warm = str(Path(tmp) / "warm")
        SubwordLMTask(path=path, vocab_size=vocab_size, cache_dir=warm).setup()  # trains its BPE, writes its cache
        for _ in range(repeats):
            t0 = time.perf_counter()
            again = SubwordLMTask(path=path, vocab_size=vocab_size, cache_dir=warm)
            again.setup()
            reads.append(time.perf_counter() - t0)
            assert again.cache_hit
    return {"path": os.path.relpath(path, ROOT), "documents": len(docs), "tokens": tokens, "vocab_size": vocab_size,
            "cores": len(os.sched_getaffinity(0)), "repeats": repeats, "hf_encode_s": min(hf),
            "cache_write_s": min(writes), "cache_read_s": min(reads), "ratio": min(writes) / min(hf)}


def table(result: dict) -> str:
    return "\n".join([
        "## The subword token cache (generated)", "",
        f"`{result['command']}` on {result['machine']}, {result['date']} ({result['cores']} cores; best of "
        f"{result['repeats']}): {result['documents']:,} documents of `{result['path']}`, {result['tokens']:,} tokens "
        f"at a byte-level BPE of {result['vocab_size']:,}"
        + (f"; {result['load']}" if result.get("load") else "") + ".", "",
        "| step | seconds |", "|---|---:|",
        f"| HF tokenizers' `encode_batch` over every document | {result['hf_encode_s']:.1f} |",
        f"| nas-run's tokenization into the cache (the same encoding, byte counts, files) | "
        f"{result['cache_write_s']:.1f} ({result['ratio']:.2f}x) |",
        f"| a second run's `setup()`, the cache in place | {result['cache_read_s']:.2f} |", ""])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--path", default=str(ROOT.parent / "shared" / "data" / "wikipedia_en"))
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--load", default=None, help="what else ran on the machine during the measurement, said with it")
    add_output_options(p, ROOT / "docs" / "bench_subword.json", ROOT / "docs" / "benchmarks.md")
    args = p.parse_args()
    print(table(run_and_write(args, lambda: {**measure(args.path, args.vocab_size, args.repeats),
                                             **({"load": args.load} if args.load else {})}, table,
                              "python benchmarks/subword_cache.py")))


if __name__ == "__main__":
    main()
