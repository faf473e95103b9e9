"""``nas-bench gpu-check``: is every scheme right on this GPU, in every precision?

    nas-bench gpu-check                     # on a CUDA machine: everything below, a table, exit 1 on a failure
    nas-bench gpu-check --device cpu        # the same checks on the CPU (float32 and bf16), e.g. in CI

On a machine without CUDA, ``nas-bench gpu-check`` says so in one line and exits 0 with nothing run.

1. **Numerics.** Every scheme in ``conf/attention/``, in the encoder form (with and without
   padding), the decoder's causal/prefix form (with and without padding) and cross-attention,
   forward and backward in float32, bf16 and fp16 (bf16/fp16 as ``trainer.precision=*-mixed``
   runs them: autocast over float32 inputs and parameters) against a float64 reference computed
   on the same inputs on the same device. Error = max |x - x_ref| / max |x_ref| over the real
   (unpadded) positions, for the output and the q, k and v gradients (a reference that is 0,
   as one-layer additive attention's dq, is measured against the largest reference value);
   tolerances in :data:`TOLERANCES`.
2. **Training.** A few steps of each task family (translation, language model, headline
   generation) on small generated data through the real ``nas-run``: ``trainer=gpu`` with
   ``bf16-mixed``, and again with ``compile=true`` (on ``--device cpu``: ``trainer=cpu``,
   float32, no compile).
3. **DDP.** Where more than one GPU is present, a 2-GPU ``trainer=ddp`` run.
"""
from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import MappingProxyType

import torch

#: max relative error (see module docstring) allowed per compute precision
TOLERANCES = MappingProxyType({"float32": 1e-4, "bf16": 4e-2, "fp16": 5e-3})
#: (form name, location, causal, padded)
FORMS = (("encoder", "encoder", False, False), ("encoder+pad", "encoder", False, True),
         ("prefix", "decoder", True, False), ("prefix+pad", "decoder", True, True), ("cross+pad", "cross", False, True))


def scheme_names() -> list[str]:
    """Every scheme of the registry, plus ``<name>-flex`` (attention.impl=flex, FlexAttention) and
    ``<name>-triton`` (attention.impl=triton: Triton kernels of the prefix form) for the schemes
    with an ``impl`` option."""
    from nas_cli.model.choices import available, scheme_config

    names = available("attention")
    return names + [f"{n}-{impl}" for impl in ("flex", "triton") for n in names if "impl" in scheme_config(n)]


def make_core(scheme: str, location: str, causal: bool, heads: int, d_head: int, seed: int = 0):
    from nas_cli.model.choices import scheme_config
    from nas_cli.model.plan import make_core_factory

    name, _, impl = scheme.partition("-")
    cfg = scheme_config(name)
    if impl in ("flex", "triton"):
        cfg.impl = impl
    core = make_core_factory(cfg, heads)(location, 0, causal)
    core.set_width(heads * d_head)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in core.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return core.eval()


def _causal_self_only(scheme: str) -> bool:
    from hydra.utils import get_class

    from nas_cli.model.choices import scheme_config

    return bool(get_class(str(scheme_config(scheme.partition("-")[0])._target_)).causal_self_only)


def _inputs(b, h, sq, sk, d, seed, device):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(b, h, s, d, generator=g, dtype=torch.float64) * 1.5).to(device) for s in (sq, sk, sk)]


def _run(core, q, k, v, q_mask, k_mask, upstream, autocast_dtype=None):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    device = q.device.type
    ctx = torch.autocast(device, dtype=autocast_dtype) if autocast_dtype is not None else _null()
    features = getattr(core, "input_features", None)  # a wrapped core (the tests') may have none
    n = features(q.size(-1)) if features else 0  # gated / forgetting attention: a layer-input projection, from q
    extra = {"x": torch.cat([q] * -(-n // q.size(-1)), -1)[..., :n].detach() * 0.7} if n else {}
    with ctx:
        out = core(q, k, v, q_mask=q_mask, k_mask=k_mask, **extra).out
    (out.to(upstream.dtype) * upstream).sum().backward()
    # and the dtype the core answered in (checked against the autocast dtype)
    return [t.detach().double() for t in (out, q.grad, k.grad, v.grad)], out.dtype


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _rel(x: torch.Tensor, ref: torch.Tensor, keep: torch.Tensor | None, floor: float = 0.0) -> float:
    if keep is not None:
        x, ref = x * keep, ref * keep
    scale = max(float(ref.abs().max()), floor, 1e-12)
    return float((x - ref).abs().max()) / scale


def check_numerics(device: str, dtypes: list[str], schemes: list[str] | None = None, b: int = 2, h: int = 4,
                   s: int = 48, d: int = 32) -> list[dict]:
    rows = []
    for scheme in schemes or scheme_names():
        for form, location, causal, padded in FORMS:
            if not causal and _causal_self_only(scheme):  # forgetting, selective, stick-breaking: no such form
                continue
            sq, sk = (s // 2, s) if location == "cross" else (s, s)
            q, k, v = _inputs(b, h, sq, sk, d, 1, device)
            q_mask = k_mask = keep_q = keep_k = None
            if padded:  # the second sequence is shorter: its tail is padding
                k_mask = torch.ones(b, sk, dtype=torch.bool, device=device)
                k_mask[1, sk - sk // 3:] = False
                if location == "cross":
                    q_mask = torch.ones(b, sq, dtype=torch.bool, device=device)
                    q_mask[1, sq - sq // 4:] = False
                else:  # self-attention: queries and keys are the same positions
                    q_mask = k_mask
                keep_q = q_mask[:, None, :, None].double()
                keep_k = k_mask[:, None, :, None].double()
            upstream = torch.randn(b, h, sq, d, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
            upstream = upstream.to(device)
            try:
                base = make_core(scheme, location, causal, h, d).to(device)
                ref_core = copy.deepcopy(base).double()
                if hasattr(ref_core, "impl"):  # the reference is the materialized formula
                    ref_core.impl = "naive"
                ref, _ = _run(ref_core, q, k, v, q_mask, k_mask, upstream)
            except Exception as err:  # noqa: BLE001 - recorded, not raised: the table shows every case
                rows.append(_row(scheme, form, "float64", None, None, None, f"reference failed: {_short(err)}"))
                continue
            for dtype in dtypes:
                tol = TOLERANCES[dtype]
                try:
                    core = copy.deepcopy(base).float()
                    cast = {"float32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
                    got, out_dtype = _run(core, q.float(), k.float(), v.float(), q_mask, k_mask, upstream.float(), cast)
                    keeps = (keep_q, keep_q, keep_k, keep_k)
                    # a gradient that is exactly 0 in float64 (one-layer additive attention's dq) is
                    # measured against the other tensors' scale, not against 0
                    top = max(float(r.abs().max()) for r in ref)
                    errs = [_rel(x, r, kp, top if float(r.abs().max()) < 1e-9 * top else 0.0)
                            for x, r, kp in zip(got, ref, keeps)]
                    finite = all(bool(torch.isfinite(x).all()) for x in got)
                    # a half-precision output in another half precision than autocast's: the core ignored
                    # the run's precision (FlexAttention under bf16 autocast computed in float16)
                    other = cast is not None and out_dtype in (torch.float16, torch.bfloat16) and out_dtype != cast
                    rows.append(_row(scheme, form, dtype, errs[0], max(errs[1:]), tol,
                                     f"computes in {out_dtype} under {dtype} autocast" if other else
                                     None if finite and max(errs) <= tol else
                                     ("non-finite values" if not finite else "above tolerance")))
                except Exception as err:  # noqa: BLE001
                    rows.append(_row(scheme, form, dtype, None, None, tol, f"error: {_short(err)}"))
    return rows


def _row(scheme, form, dtype, err_out, err_grad, tol, problem):
    return {"check": "numerics", "scheme": scheme, "form": form, "dtype": dtype, "err_out": err_out,
            "err_grad": err_grad, "tolerance": tol, "ok": problem is None, "problem": problem}


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"{type(err).__name__}: {text}"[:160]


# ---- training through nas-run ------------------------------------------------------------------------
def _write_data(root: Path) -> dict[str, Path]:
    import random

    rng = random.Random(0)
    words = "ein der die das mann frau hund katze läuft spielt park ball rot blau klein groß".split()
    out = {}
    for name, (src, tgt, splits) in {"mt": ("de", "en", ("train", "valid", "test")),
                                     "giga": ("article", "title", ("train", "valid", "test"))}.items():
        d = root / name
        d.mkdir(parents=True)
        for split, n in zip(splits, (200, 30, 30)):
            a = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) for _ in range(n)]
            (d / f"{split}.{src}").write_text("\n".join(a) + "\n")
            (d / f"{split}.{tgt}").write_text("\n".join(" ".join(reversed(x.split())) for x in a) + "\n")
        out[name] = d
    lm = root / "lm"
    lm.mkdir()
    for split, n in (("train", 300), ("valid", 40), ("test", 40)):
        (lm / f"{split}.txt").write_text("\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(4, 14)))
                                                   for _ in range(n)) + "\n")
    out["lm"] = lm
    return out


def train_cases(device: str, data: dict[str, Path]) -> list[tuple[str, list[str]]]:
    families = [
        ("translation", ["task=iwslt14", f"task.path={data['mt']}", "task.vocab_size=150", "task.max_tokens=512",
                         "task.num_workers=0", "task.beam=2"]),
        ("language model", ["task=wikitext2", f"task.path={data['lm']}", "task.tokens_per_sample=32",
                            "task.context_window=24"]),
        ("headlines", ["task=gigaword", f"task.path={data['giga']}", "task.vocab_size=150", "task.max_tokens=512",
                       "task.num_workers=0", "task.beam=2"]),
    ]
    common = ["model=tiny", "debug=fast", "logger=csv", "progress_bar=false", "trainer.max_steps=6",
              "trainer.val_check_interval=3"]
    settings = ([("bf16-mixed", ["trainer=gpu", "trainer.precision=bf16-mixed"]),
                 ("bf16-mixed + compile", ["trainer=gpu", "trainer.precision=bf16-mixed", "compile=true"])]
                if device == "cuda" else [("float32", ["trainer=cpu"])])
    cases = [(f"{fam}, {name}", [*args, *common, *extra]) for fam, args in families for name, extra in settings]
    if device == "cuda":  # the fused paths, at the lengths of real batches (a new length each step)
        cases += [(f"translation, DNAS impl={impl}, bf16-mixed",
                   [*families[0][1], *common, "trainer=gpu", "trainer.precision=bf16-mixed", "attention=dnas",
                    f"attention.impl={impl}", "model.attention_dropout=0.0"]) for impl in ("flex", "triton")]
    if device == "cuda" and torch.cuda.device_count() > 1:
        cases.append(("translation, DDP on 2 GPUs", [*families[0][1], *common, "trainer=ddp", "trainer.devices=2",
                                                     "trainer.precision=bf16-mixed"]))
    return cases


def _nas_run() -> str:
    """The nas-run beside this interpreter (a virtual environment), else the one on PATH (an
    install with ``pip --target`` or ``--user``)."""
    beside = Path(sys.executable).with_name("nas-run")
    return str(beside) if beside.is_file() else (shutil.which("nas-run") or str(beside))


def _last_error_line(stderr: str) -> str:
    """The line that says what went wrong: the last one, less Hydra's closing hint
    ('Set the environment variable HYDRA_FULL_ERROR=1 ...'), which says nothing of the error."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip() and "HYDRA_FULL_ERROR" not in ln]
    return (lines or ["no output"])[-1][:200]


def check_training(device: str, timeout: int = 600, jobs: int = 1) -> list[dict]:
    """Each case through the real ``nas-run``; ``jobs`` cases at a time (they share the device:
    for checking, not for timing)."""
    nas_run = _nas_run()
    with tempfile.TemporaryDirectory() as tmp:
        data = _write_data(Path(tmp) / "data")

        def one(i_case):
            i, (name, args) = i_case
            run_dir = Path(tmp) / f"run{i}"
            t0 = time.perf_counter()
            try:
                proc = subprocess.run([nas_run, *args, f"hydra.run.dir={run_dir}"], capture_output=True, text=True,
                                      timeout=timeout, cwd=tmp)
                ok = proc.returncode == 0 and (run_dir / "summary.json").is_file()
                problem = None if ok else _last_error_line(proc.stderr)
                loss = json.loads((run_dir / "summary.json").read_text())["test"].get("test/loss") if ok else None
            except subprocess.TimeoutExpired:
                ok, problem, loss = False, f"timed out after {timeout} s", None
            return {"check": "training", "case": name, "seconds": time.perf_counter() - t0, "test_loss": loss,
                    "ok": ok and loss is not None and loss == loss, "problem": problem}

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            return list(pool.map(one, enumerate(train_cases(device, data))))


# ---- entry point -------------------------------------------------------------------------------------
def main(args) -> int:
    from rich.console import Console
    from rich.table import Table

    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("nas-bench gpu-check: error: no CUDA device on this machine; nothing was run (use --device cpu to run "
              "the checks on the CPU)", file=sys.stderr)
        return 2
    dtypes = [d.strip() for d in args.dtypes.split(",")] if args.dtypes else (
        ["float32", "bf16", "fp16"] if device == "cuda" else ["float32", "bf16"])
    unknown = [d for d in dtypes if d not in TOLERANCES]
    if unknown:
        print(f"nas-bench gpu-check: error: --dtypes {','.join(unknown)}: use float32, bf16, fp16", file=sys.stderr)
        return 2
    schemes = [s.strip() for s in args.schemes.split(",")] if args.schemes else None
    rows = [] if args.only == "training" else check_numerics(device, dtypes, schemes)
    if not args.skip_training and args.only != "numerics":
        rows += check_training(device, jobs=args.jobs)
    console = Console(width=160)
    where = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    num = Table(title=f"nas-bench gpu-check: numerics on {where} (torch {torch.__version__}); error = max |x - "
                      "x_ref| / max |x_ref| vs float64")
    for col in ("scheme", "form", "dtype", "output err", "grad err", "tolerance", "result"):
        num.add_column(col)
    numerics = [r for r in rows if r["check"] == "numerics"]
    for r in numerics:
        fmt = (lambda x: "-" if x is None else f"{x:.2e}")
        num.add_row(r["scheme"], r["form"], r["dtype"], fmt(r["err_out"]), fmt(r["err_grad"]), fmt(r["tolerance"]),
                    "ok" if r["ok"] else f"[red]FAIL[/] {r['problem']}")
    if numerics:
        console.print(num)
    train = [r for r in rows if r["check"] == "training"]
    if train:
        t = Table(title="training steps through nas-run")
        for col in ("case", "seconds", "test loss", "result"):
            t.add_column(col)
        for r in train:
            t.add_row(r["case"], f"{r['seconds']:.0f}", "-" if r["test_loss"] is None else f"{r['test_loss']:.3f}",
                      "ok" if r["ok"] else f"[red]FAIL[/] {r['problem']}")
        console.print(t)
    if args.out_json:
        Path(args.out_json).write_text(json.dumps({"device": where, "torch": torch.__version__, "rows": rows},
                                                  indent=1))
    failed = [r for r in rows if not r["ok"]]
    print(f"nas-bench gpu-check: {len(rows) - len(failed)} of {len(rows)} checks passed")
    return 1 if failed else 0


def add_parser(sub) -> None:
    p = sub.add_parser("gpu-check", help="every scheme vs a float64 reference in float32/bf16/fp16, then training "
                                         "steps of each task family (see nas_cli/bench/gpucheck.py)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dtypes", help="comma-separated: float32, bf16, fp16 (default: all on CUDA, float32,bf16 on CPU)")
    p.add_argument("--schemes", help="comma-separated scheme names (default: every conf/attention/*.yaml)")
    p.add_argument("--skip-training", action="store_true", help="numerics only")
    p.add_argument("--only", choices=["numerics", "training"], help="run one of the two checks")
    p.add_argument("--jobs", type=int, default=1, help="training cases run at a time (default 1)")
    p.add_argument("--out-json", help="also write the rows as JSON")
