"""The attention registry is the folder ``conf/attention/``: one YAML file per scheme,
whose ``_target_`` names the core class. This module reads it; it keeps no list."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from .attention import AttentionCore, SchemeError
from .model import LOCATIONS

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
_PLACEMENT_KEYS = {"name", *LOCATIONS}


def available(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def scheme_options(attn_cfg: DictConfig, scheme: str) -> dict[str, Any]:
    """Options (``_target_`` and keyword arguments) of ``scheme``.

    The scheme chosen with ``attention=<name>`` takes its options from the composed
    config (so ``attention.u_init=0.1`` applies); a scheme named only at a location
    (``attention.decoder=unas``) takes its defaults from ``conf/attention/<name>.yaml``."""
    if scheme == attn_cfg.get("name"):
        opts = OmegaConf.to_container(attn_cfg, resolve=True)
    else:
        path = CONF_DIR / "attention" / f"{scheme}.yaml"
        if not path.is_file():
            raise SchemeError(f"unknown attention scheme '{scheme}'; valid choices: {', '.join(available('attention'))}")
        opts = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    return {k: v for k, v in opts.items() if k not in _PLACEMENT_KEYS}


def placement(attn_cfg: DictConfig) -> dict[str, str]:
    """{location: scheme name}, validated against the registry."""
    out = {}
    for loc in LOCATIONS:
        name = str(attn_cfg.get(loc, attn_cfg.get("name")))
        if not (CONF_DIR / "attention" / f"{name}.yaml").is_file():
            raise SchemeError(
                f"attention.{loc}={name} is not a known scheme; valid choices: {', '.join(available('attention'))}"
            )
        out[loc] = name
    return out


def make_core_factory(attn_cfg: DictConfig, heads: int, dropout: float = 0.0):
    """Returns core_factory(location, layer, causal) -> AttentionCore for the model.

    ``causal`` is the key mask of self-attention; cross-attention in a decoder is built
    with ``prefix_queries=True`` so no scheme can aggregate over future target queries."""
    where = placement(attn_cfg)
    options = {name: scheme_options(attn_cfg, name) for name in set(where.values())}

    def factory(location: str, layer: int, causal: bool) -> AttentionCore:
        core = instantiate(options[where[location]], heads=heads, causal=causal, dropout=dropout,
                           prefix_queries=causal or location in ("decoder", "cross"))
        core.location, core.layer = location, layer
        return core

    return factory


def scheme_tag(attn_cfg: DictConfig) -> str:
    """Short name for run directories and W&B: 'dnas' or 'enc-hnas_dec-unas_cross-unas'."""
    return tag_from_placement(placement(attn_cfg))


def tag_from_placement(where: dict[str, str]) -> str:
    """{location: scheme} -> 'dnas' when one scheme is used everywhere, else per location."""
    if len(set(where.values())) == 1:
        return where["encoder"]
    short = {"encoder": "enc", "decoder": "dec", "cross": "cross"}
    return "_".join(f"{short[loc]}-{where[loc]}" for loc in LOCATIONS)
