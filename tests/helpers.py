"""Shared helpers for tests: build cores straight from the registry files."""
from __future__ import annotations

import torch
from omegaconf import OmegaConf

from nas_cli.registry import CONF_DIR, make_core_factory


def build_core(scheme: str, heads: int = 4, causal: bool = False, location: str = "encoder", **overrides):
    cfg = OmegaConf.load(CONF_DIR / "attention" / f"{scheme}.yaml")
    for k, v in overrides.items():
        cfg[k] = v
    core = make_core_factory(cfg, heads)(location, 0, causal)
    if hasattr(core, "set_width"):  # width-dependent parameters, as MultiHeadAttention does; d_head 8 = qkv()'s
        core.set_width(heads * 8)
    torch.manual_seed(0)
    if hasattr(core, "u_logit"):  # make HNAS a genuine mixture with distinct heads
        with torch.no_grad():
            core.u_logit.copy_(torch.linspace(-1.5, 1.5, heads))
    for p in core.parameters():  # schemes with their own parameters: non-trivial values
        if p.requires_grad and p.dim() > 1:
            torch.nn.init.normal_(p, std=0.3)
    return core.eval()


def qkv(b=2, h=4, sq=7, sk=7, d=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, sq, d, generator=g, dtype=dtype) * 1.5,
            torch.randn(b, h, sk, d, generator=g, dtype=dtype) * 1.5,
            torch.randn(b, h, sk, d, generator=g, dtype=dtype))
