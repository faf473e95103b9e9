"""The attention contract as checks any scheme can be put through.

Every packaged scheme gets them in ``tests/attention/test_attention_contract.py``; a user's own
scheme gets the same ones with ``nas-bench check-scheme my_conf/attention/<name>.yaml`` (its
``_target_`` importable, e.g. with ``PYTHONPATH=.``). Each check builds the core from the
scheme's YAML in float64 at 4 heads and head size 8, with its own parameters set to non-trivial
values, and follows the scheme's declared flags (:class:`~nas_cli.attention.base.AttentionCore`):

* ``rows``: output and weight shapes; each query's weights sum to 1 unless the scheme declares
  ``rows_sum_to_one = False`` (then each row's mass lies in [0, Sk x weight_max] for nonnegative weights);
  weights >= 0 unless it declares ``nonnegative = False``, and at most its declared ``weight_max`` (1 unless
  declared: ``math.inf`` for weights without a bound); the path without weights gives the
  same output; encoder and causal forms (the encoder form not for ``causal_self_only`` schemes);
* ``cross``: the same with more keys than queries (cross-attention);
* ``gradients``: q, k and v receive finite gradients (q and k none if ``qk_gradients = False``);
* ``padding``: padded positions appended to queries and keys change no real position's output;
* ``cross_padding``: padded source keys and target queries in cross-attention likewise;
* ``causal``: in a decoder, changing queries, keys and values after position t changes no
  output at or before t (schemes with ``supports_causal``);
* ``cross_causal``: in cross-attention, later queries (target positions) do not change earlier
  outputs.

A scheme that declares :meth:`~nas_cli.attention.base.AttentionCore.input_features` gets the
layer-input projection ``x`` as the model would give it: here a fixed function of each query
position's q, so changing a later query changes its x too (the causal checks stay honest).

A failed check raises :class:`ContractError` naming what differs.
"""
from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping

import torch
from omegaconf import DictConfig, OmegaConf

__all__ = ["ContractError", "CHECKS", "build", "qkv", "run_check", "check_scheme"]

HEADS, HEAD_SIZE = 4, 8


class ContractError(AssertionError):
    """A scheme broke the contract: the message says which property and where."""


def qkv(b=2, h=HEADS, sq=7, sk=7, d=HEAD_SIZE, seed=0, dtype=torch.float64):
    """Seeded random queries, keys and values, (B, H, S, D)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, sq, d, generator=g, dtype=dtype) * 1.5,
            torch.randn(b, h, sk, d, generator=g, dtype=dtype) * 1.5,
            torch.randn(b, h, sk, d, generator=g, dtype=dtype))


def build(cfg: DictConfig | dict, heads: int = HEADS, causal: bool = False, location: str = "encoder",
          **overrides):
    """One core of the scheme ``cfg`` (its YAML) as the model builds it, in float64, eval mode,
    its own parameters set to seeded non-trivial values: matrices ~ N(0, 0.3^2), per-head vectors
    spread over [-1.5, 1.5] (distinct heads; e.g. HNAS then mixes differently in every head)."""
    from nas_cli.model.plan import make_core_factory

    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else cfg)
    for k, v in overrides.items():
        cfg[k] = v
    core = make_core_factory(cfg, heads)(location, 0, causal)
    core.set_width(heads * HEAD_SIZE)  # width-dependent parameters, as MultiHeadAttention does
    torch.manual_seed(0)
    with torch.no_grad():
        for p in core.parameters():
            if p.requires_grad and p.dim() > 1:
                torch.nn.init.normal_(p, std=0.3)
            elif p.requires_grad and p.dim() == 1 and p.numel() == heads:
                p.copy_(torch.linspace(-1.5, 1.5, heads))
    return with_input(core.double().eval())


def with_input(core):
    """``core`` as a callable of (q, k, v, ...) that also hands it ``x`` when it declares
    ``input_features``: per query position, the first n of q's features tiled, scaled (B, H, Sq, n)."""
    n = core.input_features(HEAD_SIZE)
    if not n:
        return core

    def call(q, k, v, **kw):
        reps = -(-n // q.size(-1))
        x = torch.cat([q] * reps, -1)[..., :n] * 0.7 + 0.1
        return core(q, k, v, x=x, **kw)

    for name in ("nonnegative", "rows_sum_to_one", "weight_max", "qk_gradients", "supports_causal",
                 "causal_self_only"):
        setattr(call, name, getattr(core, name))
    return call


def _close(a, b, what: str, atol: float | None = None) -> None:
    try:
        if atol is None:
            torch.testing.assert_close(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=0, atol=atol)
    except AssertionError as err:
        raise ContractError(f"{what}: {str(err).splitlines()[0]}") from None


def _require(ok, what: str) -> None:
    if not bool(ok):
        raise ContractError(what)


def _rows(weights, core, what: str) -> None:
    mass = weights.sum(-1)
    top = float(core.weight_max)
    if core.nonnegative:
        _require((weights <= top + 1e-9).all(), f"a weight above weight_max = {top:g} (declare the bound of one "
                 f"weight as weight_max, math.inf for none; largest here {float(weights.max()):.4g})")
    if core.rows_sum_to_one:
        _close(mass, torch.ones_like(mass), what + " (declare rows_sum_to_one = False if that is intended)")
    elif core.nonnegative:
        _require((mass >= 0).all() and (mass <= weights.size(-1) * top + 1e-9).all(),
                 f"a row's mass outside [0, Sk x weight_max] (weight_max = {top:g}; declare the bound of one weight "
                 "as weight_max, math.inf for none)")


def check_rows(make: Callable, causal: bool) -> None:
    core = make(causal=causal)
    q, k, v = qkv(sq=6, sk=6)
    res = core(q, k, v, need_weights=True)
    _require(res.out.shape == (2, 4, 6, 8), f"output shape {tuple(res.out.shape)}, expected (2, 4, 6, 8)")
    _require(res.weights is not None and res.weights.shape == (2, 4, 6, 6),
             "need_weights=True must return the (B, H, Sq, Sk) weights")
    _rows(res.weights, core, "each query's weights must sum to 1")
    if core.nonnegative:
        _require((res.weights >= 0).all(), "negative weights (declare nonnegative = False if that is intended)")
    _close(core(q, k, v).out, res.out, "the output without weights differs from the output with weights")


def check_cross(make: Callable) -> None:
    core = make(location="cross")
    q, k, v = qkv(sq=3, sk=9)
    res = core(q, k, v, need_weights=True)
    _require(res.out.shape == (2, 4, 3, 8) and res.weights.shape == (2, 4, 3, 9),
             "cross-attention shapes (3 queries, 9 keys)")
    _rows(res.weights, core, "cross-attention rows must sum to 1")


def check_gradients(make: Callable, causal: bool) -> None:
    core = make(causal=causal)
    q, k, v = (t.requires_grad_() for t in qkv())
    core(q, k, v).out.square().sum().backward()
    for name, t in (("q", q), ("k", k), ("v", v)):
        _require(t.grad is not None and torch.isfinite(t.grad).all(), f"{name} gets no finite gradient")
    _require(v.grad.abs().sum() > 0, "v gets a zero gradient")
    if core.qk_gradients:
        _require(q.grad.abs().sum() > 0 and k.grad.abs().sum() > 0,
                 "q or k gets a zero gradient (declare qk_gradients = False if the weights ignore them)")
    else:
        _require(q.grad.abs().max() < 1e-12 * v.grad.abs().max(), "declared qk_gradients = False, but q gets one")


def check_padding(make: Callable, causal: bool) -> None:
    core = make(causal=causal)
    q, k, v = qkv(b=1, sq=5, sk=5)
    ref = core(q, k, v, need_weights=True)
    junk_q, junk_k, junk_v = qkv(b=1, sq=3, sk=3, seed=7)
    qp, kp, vp = (torch.cat([a, 100 * j], dim=2) for a, j in ((q, junk_q), (k, junk_k), (v, junk_v)))
    mask = torch.tensor([[True] * 5 + [False] * 3])
    for need in (True, False):
        res = core(qp, kp, vp, q_mask=mask, k_mask=mask, need_weights=need)
        _close(res.out[:, :, :5], ref.out, f"padding changed real outputs (need_weights={need})")
        _require(torch.isfinite(res.out).all(), "non-finite outputs with padding")
        if need:
            _close(res.weights[:, :, :5, :5], ref.weights, "padding changed real weights")
            _require((res.weights[:, :, :, 5:] == 0).all(), "padded keys get weight")


def check_cross_padding(make: Callable) -> None:
    core = make(location="cross")
    q, k, v = qkv(b=1, sq=4, sk=6)
    ref = core(q, k, v).out
    jq, jk, jv = qkv(b=1, sq=2, sk=3, seed=3)
    res = core(torch.cat([q, jq * 50], 2), torch.cat([k, jk * 50], 2), torch.cat([v, jv], 2),
               q_mask=torch.tensor([[True] * 4 + [False] * 2]), k_mask=torch.tensor([[True] * 6 + [False] * 3]))
    _close(res.out[:, :, :4], ref, "padded source keys or target queries changed cross-attention outputs")


def check_causal(make: Callable, t: int) -> None:
    core = make(causal=True, location="decoder")
    q, k, v = qkv(sq=8, sk=8)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    g = torch.Generator().manual_seed(1)
    for a in (q2, k2, v2):
        a[:, :, t + 1:] = torch.randn(a[:, :, t + 1:].shape, generator=g, dtype=a.dtype) * 10
    for need in (True, False):
        a, b = core(q, k, v, need_weights=need), core(q2, k2, v2, need_weights=need)
        _close(a.out[:, :, : t + 1], b.out[:, :, : t + 1], f"the future leaks: positions after {t} changed "
               f"outputs at or before it (need_weights={need})", atol=1e-12)
        if need:
            _require((a.weights[..., : t + 1, t + 1:] == 0).all(), f"positions <= {t} give weight to later keys")


def check_cross_causal(make: Callable) -> None:
    core = make(location="cross")
    q, k, v = qkv(sq=6, sk=9)
    q2 = q.clone()
    q2[:, :, 3:] = q2[:, :, 3:] * -5 + 1
    for need in (True, False):
        a, b = core(q, k, v, need_weights=need).out, core(q2, k, v, need_weights=need).out
        _close(a[:, :, :3], b[:, :, :3], f"cross-attention: later queries changed earlier outputs "
               f"(need_weights={need})", atol=1e-12)


#: name -> (applies to a core with these flags?, check(make))
def _anywhere(c) -> bool:  # a form other than causal self-attention
    return not c.causal_self_only


def _in_cross(c) -> bool:
    return c.supports_causal and not c.causal_self_only


CHECKS: Mapping[str, tuple[Callable, Callable]] = MappingProxyType({
    "rows": (_anywhere, lambda make: check_rows(make, False)),
    "rows_causal": (lambda c: c.supports_causal, lambda make: check_rows(make, True)),
    "cross": (_in_cross, check_cross),
    "gradients": (_anywhere, lambda make: check_gradients(make, False)),
    "gradients_causal": (lambda c: c.supports_causal, lambda make: check_gradients(make, True)),
    "padding": (_anywhere, lambda make: check_padding(make, False)),
    "padding_causal": (lambda c: c.supports_causal, lambda make: check_padding(make, True)),
    "cross_padding": (_in_cross, check_cross_padding),
    **{f"causal_t{t}": (lambda c: c.supports_causal, lambda make, t=t: check_causal(make, t)) for t in (0, 3, 6)},
    "cross_causal": (_in_cross, check_cross_causal),
})


def _probe(cfg, overrides):
    """A core to read the flags from: the encoder form, or the decoder's for a scheme defined there only."""
    from nas_cli.attention.base import SchemeError

    try:
        return build(cfg, **overrides)
    except Exception as err:  # noqa: BLE001 - Hydra wraps the core's refusal
        if not isinstance(err.__cause__ or err, SchemeError):
            raise
        return build(cfg, **{"causal": True, "location": "decoder", **overrides})


def run_check(cfg: DictConfig | dict, name: str, **overrides) -> bool:
    """Run one check on the scheme ``cfg``; False if it does not apply to the scheme's flags,
    True if it passed; :class:`ContractError` if it failed."""
    applies, check = CHECKS[name]
    if not applies(_probe(cfg, overrides)):
        return False
    check(lambda **kw: build(cfg, **{**overrides, **kw}))
    return True


def check_scheme(path: str | Path) -> list[tuple[str, str]]:
    """Every check on the scheme of the YAML file ``path``: [(check, "passed" | "not applicable" |
    the failure)]."""
    cfg = OmegaConf.load(path)
    if not cfg.get("name"):  # as in a job: the file's stem
        cfg.name = Path(path).stem
    out = []
    for name in CHECKS:
        try:
            out.append((name, "passed" if run_check(cfg, name) else "not applicable"))
        except ContractError as err:
            out.append((name, f"FAILED: {err}"))
    return out
