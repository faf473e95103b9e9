"""nas-run's schemes inside Hugging Face Transformers models (nas_cli.hf): tiny random models
(vocab 100, hidden 32, 2 layers, like the library's own testers), no downloads.

References: the library's own SDPA path (UNAS must equal it), nas-run's cores called directly on
the q/k/v the library computed, with masks built by nas-run's own convention from the 2-D
padding mask (DNAS, HNAS, Sinkhorn), and generation without a cache (cached generation must
give the same tokens)."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

import nas_cli.hf as nh  # noqa: E402  (registers the schemes)
from nas_cli.model.choices import scheme_config  # noqa: E402
from nas_cli.model.plan import make_core_factory  # noqa: E402

LEFT = (torch.tensor([[0, 0, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6]]), torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6]))
RIGHT = (torch.tensor([[5, 6, 7, 8, 0, 0], [1, 2, 3, 4, 5, 6]]), torch.tensor([[1, 1, 1, 1, 0, 0], [1] * 6]))


def llama_config(**kw):
    from transformers import LlamaConfig

    base = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, pad_token_id=0)
    return LlamaConfig(**{**base, **kw})


def bert_config(**kw):
    from transformers import BertConfig

    base = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                pad_token_id=0)
    return BertConfig(**{**base, **kw})


def gpt2_config(**kw):
    from transformers import GPT2Config

    base = dict(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=1, eos_token_id=2,
                pad_token_id=0)
    return GPT2Config(**{**base, **kw})


def build(cls, cfg, impl: str, like: torch.nn.Module | None = None):
    """The model of ``cfg`` with attention ``impl`` in float64, eval mode, with ``like``'s weights."""
    torch.manual_seed(0)
    model = cls._from_config(cfg, attn_implementation=impl)
    if impl in nh.SCHEMES:
        nh.attach(model)
    if like is not None:
        missing, unexpected = model.load_state_dict(like.state_dict(), strict=False)
        assert not unexpected and all(".nas_core." in k or ".nas_x_proj." in k for k in missing)
    return model.double().eval()


def causal_lm(cfg):
    return transformers.AutoModelForCausalLM


# ---------------------------------------------------------------- UNAS is the library's SDPA path

@pytest.mark.parametrize("pad", [LEFT, RIGHT], ids=["left", "right"])
def test_unas_equals_sdpa_llama_with_grouped_query_attention(pad):
    from transformers import LlamaForCausalLM

    ids, am = pad
    ref = build(LlamaForCausalLM, llama_config(), "sdpa")
    ours = build(LlamaForCausalLM, llama_config(), "unas", like=ref)
    assert ours.model.layers[0].self_attn.num_key_value_groups == 2
    real = am.bool()
    diff = (ours(ids, attention_mask=am).logits - ref(ids, attention_mask=am).logits)[real]
    assert diff.abs().max().item() < 1e-10


def test_unas_is_the_librarys_sdpa_function_unless_the_weights_are_asked_for(monkeypatch):
    """UNAS through a Hugging Face model runs the library's own SDPA function (its masks,
    FlashAttention where it applies): nas-run's core serves only calls that want the weights."""
    from transformers import LlamaForCausalLM
    from transformers.integrations import sdpa_attention

    import importlib

    hf_attention = importlib.import_module("nas_cli.hf.attention")
    calls = {"sdpa": 0, "core": 0}
    real_sdpa, real_core = sdpa_attention.sdpa_attention_forward, hf_attention.attention
    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward",
                        lambda *a, **k: calls.__setitem__("sdpa", calls["sdpa"] + 1) or real_sdpa(*a, **k))
    monkeypatch.setattr(hf_attention, "attention",
                        lambda *a, **k: calls.__setitem__("core", calls["core"] + 1) or real_core(*a, **k))
    model = build(LlamaForCausalLM, llama_config(), "unas")
    ids, am = RIGHT
    model(ids, attention_mask=am)
    assert calls == {"sdpa": 2, "core": 0}  # two layers, both the library's SDPA
    out = model(ids, attention_mask=am, output_attentions=True)
    assert calls["core"] == 2 and out.attentions[0].shape == (2, 4, 6, 6)
    rows = out.attentions[1][1].sum(-1)  # the unpadded row: real distributions over the keys
    assert torch.allclose(rows, torch.ones_like(rows))


@pytest.mark.parametrize("pad", [LEFT, RIGHT], ids=["left", "right"])
@pytest.mark.parametrize("decoder", [False, True], ids=["encoder", "decoder"])
def test_unas_equals_sdpa_bert(decoder, pad):
    from transformers import BertModel

    ids, am = pad
    cfg = bert_config(is_decoder=decoder, add_cross_attention=decoder)
    ref = build(BertModel, cfg, "sdpa")
    ours = build(BertModel, cfg, "unas", like=ref)
    kw = {}
    if decoder:  # cross-attention over an "encoder output" with its own padding
        kw = dict(encoder_hidden_states=torch.randn(2, 5, 32, dtype=torch.float64),
                  encoder_attention_mask=torch.tensor([[1, 1, 1, 0, 0], [1] * 5]))
    a = ours(ids, attention_mask=am, **kw).last_hidden_state
    b = ref(ids, attention_mask=am, **kw).last_hidden_state
    assert (a - b)[am.bool()].abs().max().item() < 1e-10


def test_unas_equals_sdpa_gpt2_with_cross_attention_and_layer_scaling():
    from transformers import GPT2LMHeadModel

    ids, am = LEFT
    cfg = gpt2_config(add_cross_attention=True, scale_attn_by_inverse_layer_idx=True)
    ref = build(GPT2LMHeadModel, cfg, "sdpa")
    ours = build(GPT2LMHeadModel, cfg, "unas", like=ref)
    enc = torch.randn(2, 3, 32, dtype=torch.float64)
    a = ours(ids, attention_mask=am, encoder_hidden_states=enc).logits
    b = ref(ids, attention_mask=am, encoder_hidden_states=enc).logits
    assert (a - b)[am.bool()].abs().max().item() < 1e-10


# ---------------------------------------------------------------- the other schemes equal nas-run's cores

class Recorder:
    """Wraps the registered function of ``name``: records each layer's q/k/v and output."""

    def __init__(self, name):
        self.name, self.calls = name, []

    def __call__(self, module, query, key, value, attention_mask, **kw):
        out, w = nh.attention(self.name, module, query, key, value, attention_mask, **kw)
        self.calls.append((module, query, key, value, out))
        return out, w


@pytest.mark.parametrize("scheme", ["dnas", "hnas", "sinkhorn", "coda", "realformer"])
@pytest.mark.parametrize("family", ["llama", "bert"])
def test_schemes_equal_nas_run_cores_on_the_librarys_qkv(scheme, family):
    """Each layer's output through the library equals nas-run's own core (built by nas-run's plan,
    decoder form for Llama, encoder form for BERT) on the q/k/v the library computed, with
    q_mask = k_mask = the 2-D padding mask (left padding for Llama, right for BERT); a cascade
    (CODA, RealFormer) gets the previous layer's output, as nas-run's model hands it on."""
    from transformers import AttentionInterface, BertModel, LlamaForCausalLM

    rec = Recorder(scheme)
    AttentionInterface.register(f"rec_{scheme}", rec)
    transformers.masking_utils.AttentionMaskInterface.register(f"rec_{scheme}", nh.mask_function)
    cls, cfg, (ids, am) = ((LlamaForCausalLM, llama_config(), LEFT) if family == "llama"
                           else (BertModel, bert_config(), RIGHT))
    model = build(cls, cfg, f"rec_{scheme}")
    nh.attach(model, scheme)
    with torch.no_grad():
        for p in model.parameters():  # HNAS's u away from its initial value, differently per head
            if p.ndim == 1 and p.numel() == cfg.num_attention_heads:
                p.copy_(torch.linspace(0.2, 0.8, p.numel()))
        model(ids, attention_mask=am)
    assert len(rec.calls) == 2
    causal = family == "llama"
    real = am.bool()
    prev = None
    for module, q, k, v, out in rec.calls:
        core = make_core_factory(scheme_config(scheme), q.shape[1])("decoder" if causal else "encoder", 0, causal)
        core.load_state_dict(module.nas_core.state_dict())
        core = core.double().eval()
        rep = q.shape[1] // k.shape[1]
        kw = {"prev": prev} if core.uses_prev else {}
        prev = core(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), q_mask=real, k_mask=real, **kw)
        want = prev.out
        got = out.transpose(1, 2)
        assert (got - want)[real[:, None, :, None].expand_as(got)].abs().max().item() < 1e-12
        assert got[~real[:, None, :, None].expand_as(got)].abs().max().item() == 0  # padded queries: zeros


def test_encoder_dnas_ignores_padding():
    """In the encoder form padded queries never enter DNAS's column normalizer: more right
    padding leaves the real tokens' outputs unchanged."""
    from transformers import BertModel

    model = build(BertModel, bert_config(), "dnas")
    ids = torch.tensor([[5, 6, 7, 8]])
    a = model(ids, attention_mask=torch.ones_like(ids)).last_hidden_state
    padded = torch.tensor([[5, 6, 7, 8, 0, 0, 0]])
    b = model(padded, attention_mask=torch.tensor([[1, 1, 1, 1, 0, 0, 0]])).last_hidden_state
    assert (a - b[:, :4]).abs().max().item() < 1e-12


# ---------------------------------------------------------------- causality through the whole model

@pytest.mark.parametrize("scheme", ["dnas", "hnas", "sinkhorn", "kernel_rbf", "sigmoid", "softpick", "stickbreaking",
                                    "selective", "differential", "gated", "forgetting"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_future_tokens_never_change_earlier_logits(scheme, family):
    from transformers import GPT2LMHeadModel, LlamaForCausalLM

    cls, cfg = (LlamaForCausalLM, llama_config()) if family == "llama" else (GPT2LMHeadModel, gpt2_config())
    model = build(cls, cfg, scheme)
    ids, am = LEFT
    base = model(ids, attention_mask=am).logits
    for t in range(2, ids.shape[1] - 1):
        changed = ids.clone()
        changed[:, t + 1:] = (changed[:, t + 1:] * 7 + 3) % 100
        out = model(changed, attention_mask=am).logits
        assert torch.equal(out[:, :t + 1], base[:, :t + 1]), (scheme, t)
        assert not torch.equal(out, base)


# ---------------------------------------------------------------- cached generation is exact

@pytest.mark.parametrize("scheme", ["unas", "dnas", "hnas", "sinkhorn", "kernel_rbf", "additive", "sigmoid",
                                    "stickbreaking", "selective", "differential", "gated", "forgetting"])
def test_cached_generation_equals_uncached(scheme):
    from transformers import LlamaForCausalLM

    model = build(LlamaForCausalLM, llama_config(), scheme)
    ids, am = LEFT
    for new in (1, 4, 9):
        kw = dict(attention_mask=am, max_new_tokens=new, do_sample=False, pad_token_id=0)
        cached = model.generate(ids, use_cache=True, **kw)
        assert torch.equal(cached, model.generate(ids, use_cache=False, **kw)), (scheme, new)
    layer = model.model.layers[1].self_attn
    if scheme == "unas":  # the library's own SDPA path: nas-run keeps nothing beside the library's cache
        assert not hasattr(layer, "_nas_cache")
    else:
        state = layer._nas_cache
        assert state is not None and state[0] == ids.shape[1] + 8  # the state followed every cached key
    if scheme in ("dnas", "hnas", "sinkhorn"):  # one running column log-sum-exp per iteration
        assert len(state[1]) == (3 if scheme == "sinkhorn" else 1) and state[1][0].shape == (2, 4, 1, 14)
    elif scheme == "selective":  # head 0's running votes F for the next query, (B, 1, 1, keys so far)
        assert state[1].shape == (2, 1, 1, 14)
    elif scheme == "forgetting":  # the running sum of log forget gates of every key so far, per head
        assert state[1].shape == (2, 4, 14)
    elif scheme != "unas":  # softmax over a kernel, additive scores: nothing carried from query to query
        assert state[1] is None
    beams = dict(attention_mask=am, max_new_tokens=5, num_beams=3, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(ids, use_cache=True, **beams), model.generate(ids, use_cache=False, **beams))


@pytest.mark.parametrize("scheme", ["dnas", "hnas", "sinkhorn", "unas", "kernel_rbf", "additive"])
def test_a_cached_forward_never_steps_query_by_query(scheme, monkeypatch):
    """A forward with use_cache=True (Hugging Face's default call, training included) ran
    core.step once per query in every layer. Now it calls step never, and the state a continuation needs
    comes from one vectorized pass (core.prefill_state), equal to the query-by-query state."""
    from transformers import LlamaForCausalLM

    from nas_cli.attention.base import AttentionCore

    model = build(LlamaForCausalLM, llama_config(), scheme).train()
    ids, am = LEFT
    steps = []
    for core in {type(m) for m in model.modules() if isinstance(m, AttentionCore)}:
        monkeypatch.setattr(core, "step", lambda self, *a, _s=core.step: steps.append(1) or _s(self, *a))
    out = model(ids, attention_mask=am, use_cache=True, labels=ids)
    out.loss.backward()
    assert steps == []  # not once per query: not at all
    model.eval()
    with torch.no_grad():
        model(ids, attention_mask=am, use_cache=True)
    layer = model.model.layers[0].self_attn
    if scheme == "unas":
        return
    pending = layer._nas_cache[1]
    if scheme in ("kernel_rbf", "additive"):
        assert pending is None  # nothing to carry, nothing kept
        return
    core = layer.nas_core
    q, k, v, q_mask, k_mask = pending.tensors
    assert steps == [] and q_mask is not None and not bool(q_mask[0, :2].any())  # left padding seen
    vectorized = core.prefill_state(q, k, v, q_mask, k_mask)
    stepwise = AttentionCore.prefill_state(core, q, k, v, q_mask, k_mask)  # the default: step by step
    assert len(steps) == q.shape[-2] and len(vectorized) == len(stepwise)
    for a, b in zip(vectorized, stepwise):
        finite = torch.isfinite(b)
        assert torch.equal(finite, torch.isfinite(a)) and (a - b)[finite].abs().max().item() < 1e-12


def test_cached_continuation_is_one_query_step_of_the_full_forward():
    """The state a cached prefill leaves is what the full forward implies: prefill 4 tokens, then
    the 5th with the cache, equals the full 5-token forward's last position (DNAS, float64)."""
    from transformers import DynamicCache, LlamaForCausalLM

    model = build(LlamaForCausalLM, llama_config(), "dnas")
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    full = model(ids).logits[:, -1]
    cache = DynamicCache(config=model.config)
    model(ids[:, :4], cache=cache, use_cache=True)
    step = model(ids[:, 4:], cache=cache, use_cache=True).logits[:, -1]
    assert (full - step).abs().max().item() < 1e-12


# ---------------------------------------------------------------- refusals: one line, naming the scheme

def test_refusals_are_one_line_naming_scheme_and_form():
    from transformers import LlamaForCausalLM, MistralConfig, MistralForCausalLM

    ids = torch.tensor([[5, 6, 7, 8]])
    for scheme, words in (("realformer", "reads the previous layer's attention: call nas_cli.hf.attach(model)"),
                          ("coda", "learns parameters: call nas_cli.hf.attach(model)"),
                          ("pe_product_symmetric", "ties keys to the query projection")):
        model = transformers.AutoModelForCausalLM.from_config(llama_config(), attn_implementation=scheme)
        with pytest.raises(nh.HFAttentionError) as err:
            model(ids)
        msg = str(err.value)
        assert "\n" not in msg and f"attention '{scheme}'" in msg and words in msg
    # a scheme with no one-query step refuses cached generation, not generation
    model = build(LlamaForCausalLM, llama_config(), "coda_cs")
    model.generate(ids, max_new_tokens=2, do_sample=False, use_cache=False, pad_token_id=0)
    with pytest.raises(nh.HFAttentionError, match=r"^attention 'coda_cs' has no one-query step in this form: "
                                                  r"generate with use_cache=False$"):
        model.generate(ids, max_new_tokens=2, do_sample=False, use_cache=True, pad_token_id=0)
    # a scheme with parameters on a model attach() did not prepare
    model = LlamaForCausalLM._from_config(llama_config(), attn_implementation="hnas")
    with pytest.raises(nh.HFAttentionError, match=r"attention 'hnas' learns parameters: call nas_cli\.hf\.attach"):
        model(ids)
    # a module with no attention layer of a converted family
    with pytest.raises(nh.HFAttentionError, match=r"^attach: Linear has no attention layer nas-run recognizes"):
        nh.attach(torch.nn.Linear(2, 2), "dnas")
    # a sliding window, for a scheme that takes none
    cfg = MistralConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=2)
    model = MistralForCausalLM._from_config(cfg, attn_implementation="dnas")
    with pytest.raises(nh.HFAttentionError, match=r"^attention 'dnas': this layer has sliding_window=2, which 'dnas' "
                                                  r"does not take; schemes that do: gated, sigmoid, softpick"):
        model(ids)


@pytest.mark.parametrize("scheme", ["gated", "forgetting"])
def test_the_input_projection_is_the_models_own_trained_and_saved(scheme, tmp_path):
    """attach() gives gated and forgetting attention the projection of the layer input nas-run's own model builds: in
    the parameters (training moves it), in save_pretrained's files, and loaded back into an attached model."""
    from transformers import LlamaForCausalLM

    model = nh.attach(LlamaForCausalLM._from_config(llama_config(), attn_implementation=scheme))
    proj = model.model.layers[0].self_attn.nas_x_proj
    assert proj.out_features == 4 * (8 if scheme == "gated" else 1)  # heads x (d_head per head, or one gate)
    before = proj.weight.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    model(ids, labels=ids).loss.backward()
    opt.step()
    assert not torch.equal(proj.weight, before)
    model.save_pretrained(tmp_path)
    fresh = nh.attach(LlamaForCausalLM._from_config(llama_config(), attn_implementation=scheme))
    from safetensors.torch import load_file

    fresh.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=False)
    torch.testing.assert_close(fresh.model.layers[0].self_attn.nas_x_proj.weight, proj.weight)
    torch.testing.assert_close(fresh.eval()(ids).logits, model.eval()(ids).logits)


def gemma2(impl: str, like=None):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    cfg = Gemma2Config(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, sliding_window=3,
                       attn_logit_softcapping=5.0, pad_token_id=0)
    return build(Gemma2ForCausalLM, cfg, impl, like)


@pytest.mark.parametrize("scheme", ["unas", "sigmoid"])
def test_gemma2s_soft_capping_and_sliding_windows_reach_the_scheme(scheme):
    """Gemma 2 alternates sliding-window and global layers and soft-caps every layer's scores: a scheme that takes
    both (nas_cli/attention/mods.py) gets the layer's own values. UNAS equals the library's eager Gemma 2 (its softmax
    in float32); sigmoid attention's cached generation equals its uncached one, left padding included."""
    ref = gemma2("eager")
    model = gemma2(scheme, like=ref)
    cores = [layer.self_attn.nas_core for layer in model.model.layers]
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    logits = model(ids).logits
    assert [c.window for c in cores] == [3, None] and all(c.softcap == 5.0 for c in cores)
    if scheme == "unas":
        torch.testing.assert_close(logits, ref(ids).logits, rtol=1e-6, atol=1e-6)
    ids, am = LEFT
    kw = dict(attention_mask=am, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(ids, use_cache=True, **kw), model.generate(ids, use_cache=False, **kw))


def test_attach_gives_parameters_before_the_optimizer():
    """attach() puts HNAS's u (one per head and layer) in model.parameters() and the state dict,
    and training moves it."""
    from transformers import LlamaForCausalLM

    model = nh.attach(LlamaForCausalLM._from_config(llama_config(), attn_implementation="hnas"))
    names = [n for n, _ in model.named_parameters() if n.endswith("nas_core.u_logit") or ".nas_core." in n]
    assert len(names) == 2 and all(p.shape == (4,) for n, p in model.named_parameters() if n in names)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if n in names}
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    model(ids, labels=ids).loss.backward()
    opt.step()
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters() if n in names)
