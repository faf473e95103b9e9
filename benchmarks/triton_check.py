"""The GPU-only checks of DNAS's Triton kernels (both forms), before their timings: on a real GPU the
bf16/fp16 products go through the tensor cores (the CPU interpreter cannot run them), so there the
kernels' values and q/k/v gradients are compared with the float64 formula in float32, bf16 and
fp16, each next to SDPA's own error in the same dtype on the same inputs (the target: at most 2x, for
the values and for the gradients, whose error is the largest over q, k and v relative to each one's
largest entry; float32: 1e-5 and 1e-4),
with padding and lengths that are not multiples of the tiles; and two backward passes must give
the same bits (no atomics). ``hnas-encoder``: HNAS's one-pass encoder kernels (u = 0.3 / 0.8 per
head) against u DNAS + (1 - u) softmax in float64, and ``hnas-prefix`` the same in the causal prefix form; ``sinkhorn3-encoder``: Sinkhorn-3's 2k-pass encoder
kernels against the naive Sinkhorn core (three materialized column-row normalizations) in float64.
Every row runs the fixed tiles (32 x 32; on a GPU the prefix form's bf16/fp16 rows 64 x 32, 8 warps); on a GPU
the second size (d_head 128) runs in bf16 only, and three more rows (bf16, d=64, each encoder form) run the autotuned tiles that the timings use.

    python benchmarks/triton_check.py --out gpu_out/triton_check.json      # exit 1 if a check fails
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F


def reference(q, k, v, q_mask, k_mask, prefix: bool, causal: bool):
    from nas_cli.attention.base import allowed_mask
    from nas_cli.attention.fused import doubly_normalized_attention

    allowed = allowed_mask(q_mask, k_mask, causal, q.size(-2), k.size(-2), q.device)
    out = doubly_normalized_attention(q, k, v, allowed, prefix)
    return out if q_mask is None else out * q_mask[:, None, :, None]


def sinkhorn_reference(q, k, v, mask, iterations: int):
    """The naive Sinkhorn-k core in the encoder form (float64, autograd's backward)."""
    from nas_cli.attention.base import AttentionCore
    from nas_cli.attention.dnas import Sinkhorn

    core = Sinkhorn(q.size(1), iterations=iterations, impl="naive").to(q.device).double()
    return AttentionCore.forward(core, q, k, v, mask, mask).out * mask[:, None, :, None]


def _causal(s: int, causal: bool, device) -> torch.Tensor:
    """(S, S) bool: j <= i where ``causal``, all True otherwise."""
    full = torch.ones(s, s, dtype=torch.bool, device=device)
    return full.tril() if causal else full


FORMS = ("encoder", "hnas-encoder", "sinkhorn3-encoder", "prefix", "hnas-prefix")


def _rel_err(got, want) -> float:
    """The largest of the gradients' max |error| / max |reference| (q, k, v)."""
    return max((a.double() - w).abs().max().item() / w.abs().max().item() for a, w in zip(got, want))


def check(form: str, b: int, h: int, s: int, d: int, device: str = "cuda", seed: int = 0, tiles: str = "fixed",
          dtypes=(torch.float32, torch.bfloat16, torch.float16)) -> list[dict]:
    """Rows of one form and size; ``tiles``: "fixed" (the interpreter's 32 x 32) or "auto" (the
    encoder kernels' autotuned tiles on a GPU, nas_cli/attention/triton_tiles.py)."""
    os.environ["NAS_TRITON_TILES"] = tiles
    from nas_cli.attention.triton_encoder import encoder_dnas_triton, encoder_hnas_triton
    from nas_cli.attention.triton_prefix import prefix_dnas_triton, prefix_hnas_triton

    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(b, h, s, d, device=device, dtype=torch.float64, generator=g) for _ in range(3))
    mask = torch.ones(b, s, dtype=torch.bool, device=device)
    mask[0, -(s // 7):] = False
    causal = form in ("prefix", "hnas-prefix")
    iterations = 3 if form == "sinkhorn3-encoder" else 1
    u = torch.tensor([0.3, 0.8] * (h // 2) + [0.5] * (h % 2), device=device)
    run = ((lambda *x: prefix_hnas_triton(*x, u, mask, mask, causal=True)) if form == "hnas-prefix"
           else (lambda *x: prefix_dnas_triton(*x, mask, mask, causal=True)) if causal
           else (lambda *x: encoder_hnas_triton(*x, u, mask, mask)) if form == "hnas-encoder"
           else (lambda *x: encoder_dnas_triton(*x, mask, mask, iterations=iterations)))
    x64 = [t.clone().requires_grad_() for t in (q, k, v)]
    want = reference(*x64, mask, mask, causal, causal) if iterations == 1 else sinkhorn_reference(*x64, mask, 3)
    if form in ("hnas-encoder", "hnas-prefix"):
        w = u.double()[None, :, None, None]
        soft = F.scaled_dot_product_attention(*x64, attn_mask=mask[:, None, None, :] & _causal(s, causal, device))
        want = w * want + (1 - w) * soft * mask[:, None, :, None]
    dout = torch.randn(want.shape, device=device, dtype=torch.float64, generator=g) * mask[:, None, :, None]
    want_grads = torch.autograd.grad(want, x64, dout)
    sdpa_x64 = [t.clone().requires_grad_() for t in (q, k, v)]
    sdpa64 = F.scaled_dot_product_attention(*sdpa_x64, is_causal=causal)
    sdpa_grads64 = torch.autograd.grad(sdpa64, sdpa_x64, dout)
    rows = []
    for dtype in dtypes:
        x = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out = run(*x)
        grads = torch.autograd.grad(out, x, dout.to(dtype))
        again = torch.autograd.grad(run(*x), x, dout.to(dtype))
        xs = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        sdpa_out = F.scaled_dot_product_attention(*xs, is_causal=causal)
        sdpa = (sdpa_out.double() - sdpa64).abs().max().item()
        sdpa_g = _rel_err(torch.autograd.grad(sdpa_out, xs, dout.to(dtype)), sdpa_grads64)
        err = (out.double() - want).abs().max().item()
        gerr = _rel_err(grads, want_grads)
        ok = all(torch.equal(a, c) for a, c in zip(grads, again))
        limit, glimit = (1e-5, 1e-4) if dtype == torch.float32 else (2 * sdpa, 2 * sdpa_g)
        rows.append({"form": form, "tiles": tiles, "B": b, "H": h, "S": s, "d": d, "dtype": str(dtype).split(".")[1],
                     "max_err": err, "sdpa_err": sdpa, "grad_rel_err": gerr, "sdpa_grad_rel_err": sdpa_g,
                     "deterministic": ok, "pass": bool(ok and err <= limit and gerr <= glimit)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="outputs/triton_check.json",
                   help="the rows as JSON (default outputs/triton_check.json: outputs/ is where results go, not in git)")
    p.add_argument("--device", default="cuda", help="cuda; cpu runs under TRITON_INTERPRET=1 at --small sizes")
    p.add_argument("--small", action="store_true", help="S=40 and 23, d=16: for the CPU interpreter")
    p.add_argument("--forms", default=",".join(FORMS),
                   help=f"comma-separated, of {', '.join(FORMS)} (e.g. one per process, so that the kernels of "
                        "several forms compile at once)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (an unknown form is an error): args.forms becomes a list."""
    p = make_parser()
    args = p.parse_args(argv)
    args.forms = [f for f in args.forms.split(",") if f]
    unknown = sorted(set(args.forms) - set(FORMS))
    if unknown:
        p.error(f"--forms: unknown {', '.join(unknown)} (choose from {', '.join(FORMS)})")
    return args


def main() -> int:
    args = parse_args()
    forms = args.forms
    rows = []
    sizes = ((40, 16), (23, 16)) if args.small else ((1000, 64), (777, 128))
    for form in forms:
        # the second size (d_head 128 on a GPU) for DNAS's two forms only, and on a GPU in bf16 only (the
        # timed dtype): every size, form and dtype is a compilation on the GPU (Triton caches none between
        # machines; the prefix form's 24 took 158 s on a 2-core machine once its kernels had two loops
        # each, 92 s without float32 and fp16 at d_head 128), and a GPU machine's time may be short
        for i, (s, d) in enumerate(sizes if form in ("encoder", "prefix") else sizes[:1]):
            dtypes = (torch.float32, torch.bfloat16, torch.float16) if i == 0 or args.small else (torch.bfloat16,)
            rows += check(form, 2, 2 if args.small else 4, s, d, args.device, dtypes=dtypes)
    if args.device == "cuda":  # the autotuned tiles the timings use, in bf16 at the timed head dim
        for form in [f for f in ("encoder", "hnas-encoder", "sinkhorn3-encoder") if f in forms]:
            rows += check(form, 2, 4, 1000, 64, args.device, tiles="auto", dtypes=(torch.bfloat16,))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU (Triton interpreter)"
    Path(args.out).write_text(json.dumps({"device": name, "torch": torch.__version__,
                                          "rows": rows}, indent=1) + "\n")
    return 0 if all(r["pass"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
