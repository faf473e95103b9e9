"""Hugging Face model families as nas-run models: ``model=hf_llama``, ``hf_gpt2`` (language
models) and ``hf_bert`` (an encoder-decoder pair of BERTs, for translation).

The models are the library's own (``from_config``: random weights, no download) with the job's
attention plan in every layer (:func:`nas_cli.hf.attach` with the plan's core cores, so each
location gets its scheme and ``attention.<option>=`` overrides hold). :class:`HFCausalLM` and
:class:`HFSeq2Seq` give them the interface nas-run's Lightning module, decoding and diagnostics
read from nas-run's own models: ``forward`` -> (logits, {location: [AttentionOutput per
layer]}); the weights are the ones the registered attention function returned
(``output_attentions``), not those of a copy of the model. Training, checkpoints, resume, W&B
logging, diagnostics and nas-report are nas-run's, unchanged.

``conf/model/hf_<name>.yaml`` names the ``family`` and the sizes in nas-run's words
(``d_model``, ``heads``, ``decoder_layers``, ``ffn``, ``max_len``, ...); :data:`FAMILIES`
maps them onto each family's config class.
"""
from __future__ import annotations

from types import MappingProxyType
from contextlib import contextmanager
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from nas_cli.attention.base import AttentionOutput
from nas_cli.errors import UserError
from nas_cli.model.transformer import adaptive_output, greedy_decode


def _llama(m: dict[str, Any], vocab: int, pad: int) -> tuple[str, dict[str, Any]]:
    return "LlamaConfig", dict(
        vocab_size=vocab, hidden_size=m["d_model"], num_attention_heads=m["heads"],
        num_key_value_heads=m.get("kv_heads") or m["heads"], num_hidden_layers=m["decoder_layers"],
        intermediate_size=m["ffn"], max_position_embeddings=m["max_len"], attention_dropout=m.get("attention_dropout", 0.0),
        rope_theta=m.get("rope_theta", 10000.0), tie_word_embeddings=m.get("tie_embeddings", True),
        pad_token_id=pad, bos_token_id=None, eos_token_id=None)


def _gpt2(m: dict[str, Any], vocab: int, pad: int) -> tuple[str, dict[str, Any]]:
    drop = m.get("dropout", 0.1)
    return "GPT2Config", dict(
        vocab_size=vocab, n_embd=m["d_model"], n_head=m["heads"], n_layer=m["decoder_layers"], n_inner=m["ffn"],
        n_positions=m["max_len"], resid_pdrop=drop, embd_pdrop=drop, attn_pdrop=m.get("attention_dropout", 0.0),
        pad_token_id=pad, bos_token_id=None, eos_token_id=None, tie_word_embeddings=True)


def _bert(m: dict[str, Any], vocab: int, pad: int, decoder: bool = False) -> tuple[str, dict[str, Any]]:
    return "BertConfig", dict(
        vocab_size=vocab, hidden_size=m["d_model"], num_attention_heads=m["heads"],
        num_hidden_layers=m["decoder_layers" if decoder else "encoder_layers"], intermediate_size=m["ffn"],
        hidden_dropout_prob=m.get("dropout", 0.1), attention_probs_dropout_prob=m.get("attention_dropout", 0.0),
        max_position_embeddings=m["max_len"], type_vocab_size=1, pad_token_id=pad, is_decoder=decoder,
        add_cross_attention=decoder)


#: model.family -> (nas-run's model options, vocabulary size, pad id) -> (config class, its arguments):
#: decoder-only language models
CAUSAL = MappingProxyType({
    "llama": _llama, "gpt2": _gpt2})
#: encoder-decoder pairs (the decoder's config: decoder=True)
PAIRS = MappingProxyType({"bert": _bert})
FAMILIES = (*CAUSAL, *PAIRS)


def hf_config(model_cfg: DictConfig | dict, vocab: int, pad: int, decoder: bool = False):
    """The library's config object for ``model_cfg`` (one line naming ``model.family`` if unknown);
    ``decoder``: the decoder of a pair."""
    import transformers

    m = OmegaConf.to_container(model_cfg, resolve=True) if isinstance(model_cfg, DictConfig) else dict(model_cfg)
    family = str(m.get("family"))
    if family not in FAMILIES:
        raise UserError(f"model.family={family} is not a Hugging Face family nas-run maps; choose one of "
                        f"{', '.join(FAMILIES)}")
    cls, kwargs = PAIRS[family](m, vocab, pad, decoder) if family in PAIRS else CAUSAL[family](m, vocab, pad)
    return getattr(transformers, cls)(**kwargs)


def wrong_task(model_cfg, lm: bool) -> str | None:
    """The one line for a model family on the wrong kind of task, or None."""
    if str(model_cfg.get("family")) in PAIRS and lm:
        return (f"model={model_cfg.get('name')} is an encoder-decoder: use it with a translation task "
                "(e.g. task=multi30k), or model=hf_llama for a language model")
    if str(model_cfg.get("family")) in CAUSAL and not lm:
        return (f"model={model_cfg.get('name')} is a decoder-only language model: use it with a language-model task "
                "(e.g. task=wikitext2)")
    return None


def _by_location(module: nn.Module) -> dict[str, list[nn.Module]]:
    """{location: [nas core per layer, in layer order]} of a library model after attach()."""
    found: dict[str, list[nn.Module]] = {}
    for m in module.modules():
        core = getattr(m, "_modules", {}).get("nas_core")
        if core is not None:
            found.setdefault(core.location, []).append(core)
    return {loc: sorted(cores, key=lambda c: c.layer) for loc, cores in found.items()}


@contextmanager
def _weights_asked(model: nn.Module, on: bool):
    """While on: every core of ``model`` returns its weights, whether or not the family passes
    ``output_attentions`` on to the attention function (GPT-2 does not)."""
    cores = [c for cs in _by_location(model).values() for c in cs] if on else []
    for core in cores:
        core.__dict__["_hf_weights"] = True
    try:
        yield
    finally:
        for core in cores:
            core.__dict__.pop("_hf_weights", None)


def _outputs(weights, cores) -> list[AttentionOutput]:
    return [AttentionOutput(None, w, core.aux()).declared_by(core) for w, core in zip(weights, cores)]


class HFCausalLM(nn.Module):
    """A library causal LM behind nas-run's language-model interface (location ``decoder``).
    With ``adaptive_softmax`` ({cutoffs, div_value}, as ``model.adaptive_softmax``) the library's
    output layer is replaced by nas-run's adaptive softmax over the base model's hidden states
    (:func:`nas_cli.model.transformer.adaptive_output`), as in nas-run's own language model."""

    def __init__(self, hf_model: nn.Module, pad_id: int, adaptive_softmax: dict | None = None):
        super().__init__()
        self.hf = hf_model
        self.pad_id = pad_id
        self.adaptive = bool(adaptive_softmax)
        if self.adaptive:
            self.generator = adaptive_output(hf_model.config.hidden_size, hf_model.config.vocab_size, adaptive_softmax)

    def _attention(self, out, need_weights: bool) -> dict:
        return {"decoder": _outputs(out.attentions, _by_location(self.hf)["decoder"])} if need_weights else {}

    def features(self, ids: torch.Tensor, need_weights: bool = False):
        """The base model's last hidden states (B, T, d) and the attention weights found."""
        with _weights_asked(self.hf, need_weights):
            out = self.hf.base_model(input_ids=ids, attention_mask=(ids != self.pad_id).long(),
                                     output_attentions=need_weights, use_cache=False)
        return out.last_hidden_state, self._attention(out, need_weights)

    def forward(self, ids: torch.Tensor, need_weights: bool = False, hidden: bool = False):
        """Logits (B, T, V) and the attention found; ``hidden``: the base model's last hidden states
        (B, T, d) instead (evaluation applies :meth:`output_logits` to the positions it scores)."""
        if self.adaptive or hidden:
            h, attn = self.features(ids, need_weights)
            if hidden:
                return h, attn
            # an adaptive softmax's full log-probabilities: logits of the same distribution
            return self.generator.log_prob(h.flatten(0, -2)).view(*h.shape[:-1], -1), attn
        with _weights_asked(self.hf, need_weights):
            out = self.hf(input_ids=ids, attention_mask=(ids != self.pad_id).long(), output_attentions=need_weights,
                          use_cache=False)
        return out.logits, self._attention(out, need_weights)

    def output_logits(self, h: torch.Tensor) -> torch.Tensor:
        """The library model's LM head on the base model's hidden states (..., d) -> logits (..., V)."""
        return self.hf.get_output_embeddings()(h)

    def target_log_prob(self, h: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """log p(target) for hidden states (N, d) without the vocabulary's logits (adaptive only)."""
        return self.generator(h, target).output


class HFSeq2Seq(nn.Module):
    """A library encoder and decoder (with cross-attention) behind nas-run's encoder-decoder
    interface: ``encode``, ``decode``, ``forward`` and greedy decoding (beam search uses
    ``encode``/``decode`` too); the decoder re-runs on the prefix at each step (``can_step``
    False)."""

    adaptive = False
    can_step = False

    def __init__(self, encoder: nn.Module, decoder: nn.Module, pad_id: int):
        super().__init__()
        self.encoder, self.decoder, self.pad_id = encoder, decoder, pad_id

    def encode(self, src: torch.Tensor, need_weights: bool = False):
        mask = src != self.pad_id
        with _weights_asked(self.encoder, need_weights):
            out = self.encoder(input_ids=src, attention_mask=mask.long(), output_attentions=need_weights)
        attn = {"encoder": _outputs(out.attentions, _by_location(self.encoder)["encoder"])} if need_weights else {}
        return out.last_hidden_state, mask, attn

    def decode(self, tgt_in, memory, memory_mask, need_weights: bool = False, last_only: bool = False,
               hidden: bool = False):
        """Logits (B, T, V); ``hidden``: the decoder's last hidden states (B, T, d) instead, before
        its LM head (:meth:`output_logits`)."""
        model = self.decoder.base_model if hidden else self.decoder
        with _weights_asked(self.decoder, need_weights):
            out = model(input_ids=tgt_in, attention_mask=(tgt_in != self.pad_id).long(),
                        encoder_hidden_states=memory, encoder_attention_mask=memory_mask.long(),
                        output_attentions=need_weights, use_cache=False)
        found = out.last_hidden_state if hidden else out.logits
        found = found[:, -1:] if last_only else found
        if not need_weights:
            return found, {}
        cores = _by_location(self.decoder)
        return found, {"decoder": _outputs(out.attentions, cores["decoder"]),
                       "cross": _outputs(out.cross_attentions, cores["cross"])}

    def output_logits(self, h: torch.Tensor) -> torch.Tensor:
        """The decoder's LM head on its hidden states (..., d) -> logits (..., V): a BERT decoder's
        head is a transform (dense, activation, LayerNorm) before the vocabulary projection."""
        head = getattr(self.decoder, "cls", None) or self.decoder.get_output_embeddings()
        return head(h)

    def forward(self, src, tgt_in, need_weights: bool = False, hidden: bool = False):
        memory, memory_mask, enc = self.encode(src, need_weights)
        out, dec = self.decode(tgt_in, memory, memory_mask, need_weights, hidden=hidden)
        return out, {**enc, **dec}

    def greedy_decode(self, src, bos_id: int, eos_id: int, max_len: int, incremental: bool = True):
        return greedy_decode(self, src, bos_id, eos_id, max_len, incremental)


def build_hf_model(model_cfg: DictConfig, cores, task) -> nn.Module:
    """``model=hf_*``: the family's model with the plan's scheme at every location."""
    import transformers

    from nas_cli.hf import HFAttentionError, attach, register
    from nas_cli.hf.attention import SDPA_SCHEME

    wrong = wrong_task(model_cfg, task.kind == "lm")
    if wrong:
        raise UserError(wrong)
    names = sorted(set(cores.names.values()) | set(cores.plan.schemes))  # every layer's (a per-layer plan)
    register(names)  # a user's scheme (hydra.searchpath) too; the layers run the cores attach() gives them
    # the library calls one function in every layer, and that function runs the layer's own core; only a model of
    # UNAS alone takes the library's SDPA path (with its masks, skipped where is_causal says the same): any other
    # scheme in any layer needs the full mask in every call
    impl = next((n for n in names if n != SDPA_SCHEME), SDPA_SCHEME)

    def made(auto, config) -> nn.Module:
        model = auto.from_config(config, attn_implementation=impl)
        try:
            return attach(model, impl, cores)
        except HFAttentionError as err:
            raise UserError(str(err)) from None

    if str(model_cfg.family) in PAIRS:
        encoder = made(transformers.AutoModel, hf_config(model_cfg, task.src_vocab_size, task.pad_id))
        decoder = made(transformers.AutoModelForCausalLM,
                       hf_config(model_cfg, task.tgt_vocab_size, task.pad_id, decoder=True))
        return HFSeq2Seq(encoder, decoder, task.pad_id)
    adaptive = model_cfg.get("adaptive_softmax")
    adaptive = OmegaConf.to_container(adaptive, resolve=True) if isinstance(adaptive, DictConfig) else adaptive
    return HFCausalLM(made(transformers.AutoModelForCausalLM,
                           hf_config(model_cfg, task.src_vocab_size, task.pad_id)), task.pad_id, adaptive)
