"""nas-run's evaluation of a language-model split against a plain PyTorch loop doing the same scored
windows, on the same threads: wall time, CPU time and peak memory, with their ratios.

Both sides read the same split through the task (the same windows of ``task.tokens_per_sample``
inputs scoring their last ``tokens_per_sample - context_window`` tokens, in the same batches) and
score it with a randomly initialised model of the same size (the cost of evaluation does not depend
on the weights):

* project: the module nas-run builds for ``model=<model>`` (its attention scheme, default ``unas``),
  evaluated by a Lightning ``Trainer.test`` as ``nas-eval --split valid`` and every validation do;
* plain: for ``model=small`` a pre-norm decoder of PyTorch's own layers (``nn.TransformerEncoderLayer``
  with a causal mask, tied embeddings, the same width, heads, depth and FFN); for ``model=hf_llama`` the
  library's ``LlamaForCausalLM`` of the same config with its ``sdpa`` attention. The output layer is
  applied to the scored positions only, with one cross entropy.

Each side runs in a process of its own. Timed is the evaluation alone (the split's loop): wall
seconds, and CPU seconds of the process (all threads). Memory is the process's peak resident size
during the evaluation (the kernel's high-water mark, reset when the evaluation starts: the data and
the model already in memory count on both sides alike). The sides alternate in each repeat.

    python benchmarks/eval_speed.py --path ../shared/data/wikitext-2      # docs/bench_eval.json + docs/benchmarks.md
    python benchmarks/eval_speed.py --path ../shared/data/wikitext-2 --models small --repeats 1
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from types import MappingProxyType

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "bench_eval.json"
MARKDOWN = ROOT / "docs" / "benchmarks.md"
SIDES = ("project", "plain")
TARGETS = MappingProxyType({"wall": 1.25, "cpu": 1.25, "peak_mb": 1.5})


def _peak_reset() -> None:
    """Reset this process's peak resident size (Linux: VmHWM), so the next reading is this phase's."""
    Path("/proc/self/clear_refs").write_text("5")


def _peak_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _config(model: str, path: str):
    from hydra import compose, initialize_config_dir

    from nas_cli.model.choices import CONF_DIR
    from nas_cli.pipeline.launch.resolvers import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=["task=wikitext2", f"task.path={path}", f"model={model}", "logger=none"])


class PlainDecoder:
    """A pre-norm decoder-only LM of PyTorch's own layers (the reference for ``model=small``)."""

    def __init__(self, vocab: int, m):
        import math

        import torch
        from torch import nn

        self.d = int(m.d_model)
        self.embed = nn.Embedding(vocab, self.d)
        nn.init.normal_(self.embed.weight, std=self.d ** -0.5)  # as nas-run's embeddings (scaled by sqrt(d) below)
        layer = nn.TransformerEncoderLayer(self.d, int(m.heads), int(m.ffn), dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.layers = nn.TransformerEncoder(layer, int(m.decoder_layers), enable_nested_tensor=False).eval()
        self.norm = nn.LayerNorm(self.d)
        pos = torch.arange(int(m.max_len))[:, None] * torch.exp(torch.arange(0, self.d, 2) * (-math.log(1e4) / self.d))
        self.positions = torch.cat([pos.sin(), pos.cos()], dim=-1)
        self.scale = math.sqrt(self.d)

    def hidden(self, ids):
        import torch

        t = ids.size(1)
        x = self.embed(ids) * self.scale + self.positions[:t]
        mask = torch.nn.Transformer.generate_square_subsequent_mask(t)
        return self.norm(self.layers(x, mask=mask, is_causal=True))

    def logits(self, h):
        return h @ self.embed.weight.T  # tied output layer


def _plain_model(cfg, task):
    if cfg.model.get("family") == "llama":
        import transformers

        from nas_cli.hf.models import hf_config

        model = transformers.LlamaForCausalLM._from_config(hf_config(cfg.model, task.src_vocab_size, task.pad_id),
                                                           attn_implementation="sdpa").eval()
        pad = task.pad_id

        def hidden(ids):
            return model.model(input_ids=ids, attention_mask=(ids != pad).long(), use_cache=False).last_hidden_state

        return hidden, model.lm_head
    plain = PlainDecoder(task.src_vocab_size, cfg.model)
    return plain.hidden, plain.logits


def run_side(side: str, model: str, path: str, threads: int) -> dict:
    """One side in this process: build, then time the evaluation of the valid split."""
    import torch
    from torch.nn import functional as F

    torch.set_num_threads(threads)
    cfg = _config(model, path)
    from nas_cli.pipeline.parts import build_task

    task = build_task(cfg)
    loader = task.val_dataloader()
    torch.manual_seed(0)
    if side == "project":
        import pytorch_lightning as pl

        from nas_cli.model.plan import AttentionPlan
        from nas_cli.pipeline.parts import build_module

        module = build_module(cfg, task, AttentionPlan.from_config(cfg.attention).model_cores(cfg.model))
        trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                             enable_model_summary=False, enable_checkpointing=False)
        _peak_reset()
        wall0, cpu0 = time.perf_counter(), time.process_time()
        metrics = trainer.test(module, dataloaders=loader, verbose=False)[0]
        loss, tokens = metrics["test/loss"], module.items["test"]["tokens"]
        tokens = sum(tokens)
    else:
        hidden, logits_of = _plain_model(cfg, task)
        pad = task.pad_id
        _peak_reset()
        wall0, cpu0 = time.perf_counter(), time.process_time()
        nll, tokens = 0.0, 0
        with torch.inference_mode():
            for batch in loader:
                ids, target = batch["ids"], batch["target"]
                keep = target != pad
                h = hidden(ids)[keep]  # (scored positions, d)
                nll += float(F.cross_entropy(logits_of(h).float(), target[keep], reduction="sum"))
                tokens += int(keep.sum())
        loss = nll / tokens
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return {"side": side, "model": model, "threads": threads, "wall": wall, "cpu": cpu, "peak_mb": _peak_mb(),
            "windows": len(loader.dataset), "tokens": tokens, "loss": loss}


def _child(side: str, model: str, args) -> dict:
    cmd = [sys.executable, __file__, "--side", side, "--models", model, "--path", args.path,
           "--threads", str(args.threads)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT))
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


def summarise(rows: list[dict]) -> list[dict]:
    """Per model: each side's medians over the repeats and the project / plain ratios."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        side = {s: [r for r in rows if r["model"] == model and r["side"] == s] for s in SIDES}
        if not all(side.values()):
            continue
        med = {s: {k: _median([r[k] for r in side[s]]) for k in ("wall", "cpu", "peak_mb")} for s in SIDES}
        ratios = {k: med["project"][k] / med["plain"][k] for k in TARGETS}
        out.append({"model": model, "repeats": min(len(v) for v in side.values()), **{s: med[s] for s in SIDES},
                    "ratios": ratios, "met": {k: ratios[k] <= TARGETS[k] for k in TARGETS},
                    "windows": side["project"][0]["windows"], "tokens": side["project"][0]["tokens"],
                    "threads": side["project"][0]["threads"]})
    return out


def markdown(data: dict) -> str:
    lines = ["## Evaluation against a plain PyTorch loop (benchmarks/eval_speed.py)", "",
             f"`{data['command']}` on {data['machine']}, {data['date']}: WikiText-2's valid split "
             f"({data['summary'][0]['tokens']:,} scored tokens in {data['summary'][0]['windows']:,} windows of "
             "256 inputs scoring their last 64), evaluation batches of 32, "
             f"{data['summary'][0]['threads']} threads on both sides; medians of {data['summary'][0]['repeats']} "
             "repeats, the sides alternating. Project: nas-run's module for the model (scheme `unas`) under "
             "Lightning's `Trainer.test`, as `nas-eval --split valid` and every validation run it; plain: a loop "
             "of PyTorch's own layers (`model=small`) or the library's Llama with `sdpa` (`model=hf_llama`) of "
             "the same size, the output layer at the scored positions only and one cross entropy. Memory: the "
             "process's peak resident size during the evaluation (data and model included on both sides). "
             f"Targets: wall and CPU <= {TARGETS['wall']}x, memory <= {TARGETS['peak_mb']}x the plain loop.", "",
             "| model | project wall | plain wall | ratio | project CPU | plain CPU | ratio | project peak | plain peak "
             "| ratio |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in data["summary"]:
        p, q, r = s["project"], s["plain"], s["ratios"]
        lines.append(f"| {s['model']} | {p['wall']:.1f} s | {q['wall']:.1f} s | **{r['wall']:.2f}x** | "
                     f"{p['cpu']:.1f} s | {q['cpu']:.1f} s | **{r['cpu']:.2f}x** | {p['peak_mb']:,.0f} MB | "
                     f"{q['peak_mb']:,.0f} MB | **{r['peak_mb']:.2f}x** |")
    if data.get("before"):
        lines += ["", data["before"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", default=str(ROOT.parent / "shared" / "data" / "wikitext-2"),
                        help="a WikiText-2 folder (train.txt, valid.txt, test.txt)")
    parser.add_argument("--models", default="small,hf_llama")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--side", choices=SIDES, help="(internal) run one side in this process, print its JSON")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--markdown", default=str(MARKDOWN))
    parser.add_argument("--table-only", action="store_true", help="rewrite the table from --out's JSON, no run")
    args = parser.parse_args(argv)
    if args.side:
        print(json.dumps(run_side(args.side, args.models, args.path, args.threads)))
        return
    out = Path(args.out)
    if args.table_only:
        write_section(json.loads(out.read_text()), Path(args.markdown))
        return
    before = json.loads(out.read_text()).get("before") if out.is_file() else None
    rows: list[dict] = []
    data = {"command": "python benchmarks/eval_speed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "date": time.strftime("%Y-%m-%d %H:%M"),
            "targets": dict(TARGETS), "rows": rows, "summary": [], "before": before}
    for _ in range(args.repeats):
        for model in args.models.split(","):
            for side in SIDES:
                rows.append(_child(side, model, args))
                print(json.dumps(rows[-1]), flush=True)
                data["summary"] = summarise(rows)
                out.write_text(json.dumps(data, indent=1))  # each finished measurement is kept
    write_section(data, Path(args.markdown))


def write_section(data: dict, path: Path) -> None:
    from nas_cli.bench.markdown import write_markdown

    write_markdown(path, markdown(data))


if __name__ == "__main__":
    main()
