"""The layer input a scheme needs besides q, k and v inside a Hugging Face model (gated attention's gate, forgetting
attention's forget gate: ``AttentionCore.input_features``).

The library's attention interface hands the registered function the projected queries, keys and values only. For a
core that asks for more, :func:`attach` gives the attention layer the projection nas-run's own model builds
(``nas_x_proj``: hidden size -> heads x features, a submodule, so it is trained, saved and loaded with the model) and
a forward pre-hook that keeps the layer's input of the current call (``hidden_states``: every position in a
training forward or a prefill, the new positions in a cached continuation). :func:`input_projection` reads them
back as the core's ``x`` (B, H, Sq, features)."""
from __future__ import annotations

import torch
from torch import nn


def _keep_input(module, args, kwargs):
    hidden = kwargs.get("hidden_states", args[0] if args else None)
    module.__dict__["_nas_input"] = hidden


def attach(module: nn.Module, core, heads: int) -> None:
    """Give ``module`` (a library attention layer whose nas-run core is ``core``) the projection and the hook the core
    needs; nothing for a core that asks for no input."""
    hidden = int(getattr(module.config, "hidden_size", 0) or getattr(module.config, "n_embd", 0))
    head_dim = int(getattr(module, "head_dim", 0) or hidden // heads)
    features = core.input_features(head_dim)
    if not features or "nas_x_proj" in module._modules:
        return
    like = next(module.parameters(), None)  # the layer's device and dtype
    proj = nn.Linear(hidden, heads * features)
    module.nas_x_proj = proj if like is None else proj.to(device=like.device, dtype=like.dtype)
    module.register_forward_pre_hook(_keep_input, with_kwargs=True)


def input_projection(module: nn.Module, heads: int) -> dict[str, torch.Tensor]:
    """``{"x": (B, H, Sq, features)}`` for a layer :func:`attach` prepared, else {}."""
    proj = module._modules.get("nas_x_proj")
    if proj is None:
        return {}
    hidden = module.__dict__.get("_nas_input")
    if hidden is None:
        raise ValueError("the layer's input was not kept: call the attention layer through its forward")
    x = proj(hidden.to(proj.weight.dtype))
    b, t, c = x.shape
    return {"x": x.view(b, t, heads, c // heads).transpose(1, 2)}
