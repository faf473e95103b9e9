"""The attention function and mask function registered for each scheme (see :mod:`nas_cli.hf`)."""
from __future__ import annotations

import math
from typing import Any

import torch

from nas_cli.attention.base import AttentionCore, SchemeError
from nas_cli.hf import inputs
from nas_cli.model.choices import available, scheme_config
from nas_cli.model.plan import make_core_factory

#: the transformers releases the tests ran with (pyproject's ``hf`` extra pins the same range)
SUPPORTED = ">=5.24,<6"


class HFAttentionError(SchemeError):
    """A call a scheme cannot serve inside a Hugging Face model (one line: scheme, form, what to do)."""


def refuse_reason(core: AttentionCore) -> str | None:
    if core.tie_qk:
        return "ties keys to the query projection (W_q = W_k), which the model's own projections do not"
    if core.input_positions or core.requires_no_input_positions:
        return "places positions itself, on top of the model's own position scheme"
    return None


def _form(module) -> tuple[str, bool]:
    """(nas-run location, causal) of a library attention layer."""
    cross = bool(getattr(module, "is_cross_attention", False)) or "CrossAttention" in type(module).__name__
    if cross:
        return "cross", False
    causal = bool(getattr(module, "is_causal", False))
    return ("decoder" if causal else "encoder"), causal


def build_core(name: str, module, heads: int, factory=None) -> AttentionCore:
    """The nas-run core of scheme ``name`` for one library layer (its form read from the layer).
    ``factory(location, layer, causal)``: nas-run's core factory (a job's attention plan, with the
    user's options); default: the scheme's packaged YAML."""
    location, causal = _form(module)
    factory = factory or make_core_factory(scheme_config(name), heads)
    core = factory(location, int(getattr(module, "layer_idx", 0) or 0), causal)
    reason = refuse_reason(core)
    if reason:
        raise HFAttentionError(f"attention '{core.name}' cannot run inside a Hugging Face model: it {reason}")
    head_dim = int(getattr(module, "head_dim", 0) or 0)
    if head_dim:
        core.set_width(head_dim * heads)
    return core


def attach(model: torch.nn.Module, name: str | None = None, factory=None) -> torch.nn.Module:
    """Give every attention layer of ``model`` its nas-run core now, as a submodule ``nas_core``,
    so that a scheme's parameters (HNAS's u, the additive scoring layers) exist before an
    optimizer is made or weights are loaded. ``name``: the scheme (default: the model's
    ``attn_implementation``); ``factory``: as in :func:`build_core`. Returns the model."""
    name = name or str(getattr(model.config, "_attn_implementation", ""))
    if factory is None and name not in available("attention"):
        raise HFAttentionError(f"attach: '{name}' is not a nas-run scheme; valid choices: "
                               f"{', '.join(available('attention'))}")
    for module in list(model.modules()):
        if _is_attention_layer(module) and "nas_core" not in module._modules:
            heads = int(getattr(module, "num_heads", 0) or getattr(module.config, "num_attention_heads", 0))
            core = build_core(name, module, heads, factory)
            like = next(module.parameters(), None)  # the layer's device, dtype and mode (attach after
            core = core if like is None else core.to(device=like.device, dtype=like.dtype)  # .double(), .eval())
            module.nas_core = core.train(module.training)
            inputs.attach(module, core, heads)  # gated and forgetting attention: the projection of the input
    if not any("nas_core" in getattr(m, "_modules", {}) for m in model.modules()):
        raise HFAttentionError(f"attach: {type(model).__name__} has no attention layer nas-run recognizes (a family "
                               "not converted to the library's attention interface?)")
    _link_cascades(model)
    return model


def _link_cascades(model: torch.nn.Module) -> None:
    """A core that reads the previous layer's attention (CODA's cascade, RealFormer's residual
    scores) gets the core of the layer below at its location; the library calls the layers in
    order within a forward, so that core's output of this forward is there to read. (Kept out of
    the module tree: plain attributes, not submodules.)"""
    by_location: dict[str, list[AttentionCore]] = {}
    for m in model.modules():
        core = getattr(m, "_modules", {}).get("nas_core")
        if core is not None:
            by_location.setdefault(core.location, []).append(core)
    for cores in by_location.values():
        cores.sort(key=lambda c: c.layer)
        for below, core in zip([None, *cores], cores):
            core.__dict__["_hf_below"] = below if core.uses_prev else None
            if below is not None and core.uses_prev:
                below.__dict__["_hf_keep"] = True


def _is_attention_layer(module) -> bool:
    return hasattr(module, "config") and hasattr(module, "is_causal") and type(module).__name__.endswith("Attention")


def _core(name: str, module, query: torch.Tensor) -> AttentionCore:
    core = module._modules.get("nas_core")
    if core is None:
        core = build_core(name, module, int(query.shape[1]))
        needs = ("learns parameters" if any(True for _ in core.parameters()) else
                 "needs a projection of the layer's input" if core.input_features(8) else None)
        if needs:
            raise HFAttentionError(f"attention '{name}' {needs}: call nas_cli.hf.attach(model) after from_config, "
                                   "before making an optimizer or loading weights")
        if core.uses_prev:
            raise HFAttentionError(f"attention '{name}' reads the previous layer's attention: call "
                                   "nas_cli.hf.attach(model) after from_config, so each layer knows the one below")
        module.nas_core = core.to(query.device).train(module.training)
    return core


# ---------------------------------------------------------------- masks

def mask_function(*args, **kwargs):
    """The library's boolean SDPA mask, never skipped for ``is_causal``: the scheme needs the
    padding it encodes (registered under every scheme's name)."""
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    kwargs["allow_is_bidirectional_skip"] = False
    return sdpa_mask(*args, **kwargs)


def _as_bool(mask: torch.Tensor | None) -> torch.Tensor | None:
    if mask is None or mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2  # an additive float mask: 0 = attend


def read_masks(name: str, mask: torch.Tensor | None, sq: int, sk: int, causal: bool, cross: bool,
               window: int | None = None):
    """(q_mask (B, Sq) | None, k_mask (B, Sk) | None) from the library's (B, 1|H, Sq, Sk) mask,
    after checking that the mask is padding plus (if causal) j <= past + i, within ``window`` keys
    (i - j < window, the layer's sliding window) where one is given, and nothing else."""
    mask = _as_bool(mask)
    if mask is None:
        return None, None
    if mask.shape[1] != 1:
        if not bool((mask == mask[:, :1]).all()):
            raise HFAttentionError(f"attention '{name}': a mask that differs between heads is not a padding mask")
        mask = mask[:, :1]
    mask = mask.expand(-1, -1, sq, sk)[:, 0]  # (B, Sq, Sk)
    k_mask = mask.any(dim=1)
    q_mask = None if cross else k_mask[:, sk - sq:]
    expected = k_mask[:, None, :].expand(-1, sq, -1)
    if causal:
        pos = torch.arange(sk, device=mask.device)
        expected = expected & (pos[None, :] <= pos[sk - sq:, None])[None]
        if window is not None:
            expected = expected & (pos[sk - sq:, None] - pos[None, :] < window)[None]
    rows = q_mask if q_mask is not None else mask.any(dim=-1)
    if not bool((mask == expected)[rows].all()):
        raise HFAttentionError(f"attention '{name}': the model's mask is not padding{' + causal' if causal else ''} "
                               "(a sliding window, chunked or packed sequences?); nas-run schemes take padding and "
                               "causal masks only")
    return q_mask, k_mask


# ---------------------------------------------------------------- the attention function

def _repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    return x if n == 1 else x.repeat_interleave(n, dim=1)


def attention(name: str, module, query, key, value, attention_mask, dropout: float = 0.0,
              scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """The registered function: (B, H, Sq, D) queries, (B, H_kv, Sk, D) keys and values ->
    ((B, Sq, H, D) output, weights or None)."""
    if kwargs.get("position_bias") is not None:
        raise HFAttentionError(f"attention '{name}': T5-style position_bias (added to the scores) is not "
                               "supported; nas-run schemes take query-key scores only")
    core = _core(name, module, query)
    window = _score_settings(name, core, kwargs.get("softcap"), kwargs.get("sliding_window"))
    core.dropout = float(dropout)
    location, causal = _form(module)
    if is_causal is not None and location != "cross" and bool(is_causal) != causal:
        raise HFAttentionError(f"attention '{name}': this call asks for is_causal={bool(is_causal)} in a layer built "
                               f"as {'causal' if causal else 'bidirectional'}; nas-run builds one form per layer")
    n_rep = int(getattr(module, "num_key_value_groups", 1) or 1)
    keys_seen = key
    key, value = _repeat_kv(key, n_rep), _repeat_kv(value, n_rep)
    d = query.shape[-1]
    if scaling is not None and not math.isclose(scaling * math.sqrt(d), 1.0, rel_tol=1e-6):
        query = query * (scaling * math.sqrt(d))
    sq, sk = query.shape[-2], key.shape[-2]
    q_mask, k_mask = read_masks(name, attention_mask, sq, sk, causal, location == "cross", window)
    # some families (GPT-2) do not pass output_attentions on to the function: nas-run's model
    # wrappers (nas_cli/hf/models.py) then ask the cores directly
    want = bool(kwargs.get("output_attentions") or core.__dict__.get("_hf_weights"))
    extra = inputs.input_projection(module, query.shape[1])
    if causal and sk > sq:
        out, weights = _continue(name, core, module, query, key, value, k_mask, keys_seen, want, extra)
    else:
        res = core(query, key, value, q_mask=q_mask, k_mask=k_mask, need_weights=want, **_below(core), **extra)
        if core.__dict__.get("_hf_keep"):  # the layer above reads it in this same forward
            core.__dict__["_hf_output"] = res
        out, weights = res.out, res.weights
        if causal and kwargs.get("use_cache"):
            _remember(name, core, module, query, key, value, q_mask, k_mask, keys_seen, extra)
    return out.transpose(1, 2).contiguous(), weights


def _score_settings(name: str, core: AttentionCore, softcap, window) -> int | None:
    """The layer's soft-capping and sliding window (Gemma 2's, Mistral's), given to a core that takes them
    (nas_cli/attention/mods.py), refused in one line by one that does not; returns the window."""
    for key, value, option in (("softcap", softcap, "softcap"), ("sliding_window", window, "window")):
        if value is None:  # the core keeps its own (attention.softcap / attention.window of the plan)
            continue
        takes = hasattr(core, option) and (option != "window" or getattr(core, "takes_window", False))
        if not takes:
            raise HFAttentionError(f"attention '{name}': this layer has {key}={value}, which '{name}' does not take; "
                                   f"schemes that do: {', '.join(schemes_taking(option))}")
        setattr(core, option, float(value) if option == "softcap" else int(value))
    return None if window is None else int(window)


def schemes_taking(option: str) -> list[str]:
    return [n for n in available("attention") if option in scheme_config(n)
            and (option != "window" or n != "selective")]


def _below(core: AttentionCore) -> dict[str, Any]:
    """``prev=``: the output of the layer below in this forward (None in the first layer), taken
    once (so it is not kept past its use)."""
    if not core.uses_prev:
        return {}
    below = core.__dict__.get("_hf_below")
    return {"prev": below.__dict__.pop("_hf_output", None) if below is not None else None}


# ---------------------------------------------------------------- cached generation

def _fingerprint(keys: torch.Tensor) -> torch.Tensor:
    """(B, Sk) summary of the cached keys of each batch row: equal rows give equal values, and a
    reordered cache (beam search) gives the same rows in another order."""
    return keys.detach().double().sum(dim=(1, 3))


def _steps(core: AttentionCore, query, key, value, k_mask, state, start: int, extra: dict):
    """New queries one at a time through core.step, the i-th against keys [0, start + i] (a cached
    continuation: one query per generated token); ``extra``: the input projection ``x`` of the new positions."""
    outs = []
    for i in range(query.shape[-2]):
        end = start + i + 1
        km = None if k_mask is None else k_mask[:, :end]
        own = {k: t[..., i:i + 1, :] for k, t in extra.items()}
        o, state = core.step(query[..., i:i + 1, :], key[..., :end, :], value[..., :end, :], km, state, **own)
        outs.append(o)
    return torch.cat(outs, dim=-2), state


class _Prefill:
    """What a cached prefill leaves for a scheme that carries a state: its queries, keys, values and
    masks (detached references, no copy). The state is computed from them in one pass
    (``core.prefill_state``) only if a cached continuation comes; a training forward, which
    Hugging Face models call with ``use_cache=True`` too, computes nothing."""

    def __init__(self, query, key, value, q_mask, k_mask, extra: dict):
        self.tensors = (query.detach(), key.detach(), value.detach(), q_mask, k_mask)
        self.extra = {k: t.detach() for k, t in extra.items()}

    def state(self, core: AttentionCore):
        with torch.no_grad():
            return core.prefill_state(*self.tensors, **self.extra)


def _remember(name, core, module, query, key, value, q_mask, k_mask, keys_seen, extra: dict) -> None:
    """After a cached prefill: what the next query needs (nothing for a scheme that carries nothing)."""
    if not core.supports_step:
        module._nas_cache = None
        return
    pending = _Prefill(query, key, value, q_mask, k_mask, extra) if core.carries_state else None
    module._nas_cache = (key.shape[-2], pending, _fingerprint(keys_seen))


def _continue(name, core, module, query, key, value, k_mask, keys_seen, want: bool, extra: dict):
    if want:
        raise HFAttentionError(f"attention '{name}': output_attentions with a KV cache is not supported; "
                               "pass use_cache=False")
    if not core.supports_step:
        raise HFAttentionError(f"attention '{name}' has no one-query step in this form: generate with "
                               "use_cache=False")
    past = key.shape[-2] - query.shape[-2]
    state = _cached_state(name, core, module, past, keys_seen[..., :past, :])
    out, state = _steps(core, query, key, value, k_mask, state, past, extra)
    module._nas_cache = (key.shape[-2], state, _fingerprint(keys_seen))
    return out, None


def _cached_state(name, core, module, past: int, past_keys: torch.Tensor):
    if not core.carries_state:  # every step is the query against the cached keys (a sliding cache's too)
        return None
    cached = getattr(module, "_nas_cache", None)
    if cached is None or cached[0] != past:
        raise HFAttentionError(f"attention '{name}': a cached continuation of {past} keys this layer did not "
                               "see (call the model with use_cache=True from the first token, or use_cache=False)")
    _, state, fp = cached
    if isinstance(state, _Prefill):
        state = state.state(core)
    now = _fingerprint(past_keys)
    if state is None or torch.equal(now, fp):
        return state
    order = []
    for row in now:  # beam search reordered (and perhaps repeated) the cache's batch rows
        match = (fp == row).all(dim=-1).nonzero()
        if match.numel() == 0:
            raise HFAttentionError(f"attention '{name}': the KV cache was changed outside generation's "
                                   "reordering; pass use_cache=False")
        order.append(int(match[0]))
    index = torch.tensor(order, device=past_keys.device)
    return tuple(s.index_select(0, index) for s in state) if isinstance(state, tuple) else state.index_select(0, index)


# ---------------------------------------------------------------- registration

def register(names: list[str] | None = None) -> tuple[str, ...]:
    """Register ``names`` (default: every scheme of conf/attention/) with the library; returns them."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    names = list(names or available("attention"))
    for name in names:
        AttentionInterface.register(name, _bound(name))
        AttentionMaskInterface.register(name, unas_mask_function if name == SDPA_SCHEME else mask_function)
    return tuple(names)


#: the scheme that is the library's own SDPA path (softmax attention): it runs as the library's
#: ``sdpa`` does, FlashAttention included, with the library's masks (a causal mask skipped where
#: there is no padding); its nas-run core serves only calls that ask for the weights
SDPA_SCHEME = "unas"


def unas_mask_function(*args, **kwargs):
    """UNAS's mask: the library's SDPA mask as the library's ``sdpa`` makes it (None where
    ``is_causal`` or no mask at all says the same, so SDPA can take its fastest kernel)."""
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


def unas_attention(module, query, key, value, attention_mask, **kwargs: Any):
    """UNAS inside a Hugging Face model: the library's own SDPA function, unless the weights are
    asked for (``output_attentions``, nas-run's diagnostics), which nas-run's core gives."""
    if kwargs.get("output_attentions") or _wants_weights(module) or kwargs.get("softcap") is not None:
        return attention(SDPA_SCHEME, module, query, key, value, attention_mask, **kwargs)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _wants_weights(module) -> bool:
    core = getattr(module, "_modules", {}).get("nas_core")
    return core is not None and bool(core.__dict__.get("_hf_weights"))


def _bound(name: str):
    if name == SDPA_SCHEME:
        return unas_attention

    def fn(module, query, key, value, attention_mask, **kwargs: Any):
        return attention(name, module, query, key, value, attention_mask, **kwargs)

    fn.__name__ = f"nas_run_{name}"
    return fn

