"""nas-run's schemes inside Hugging Face Transformers models.

    import nas_cli.hf                       # registers every scheme of conf/attention/ by its name
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="dnas")
    nas_cli.hf.attach(model)                # schemes with parameters or a cascade (hnas, coda) need it

``import nas_cli.hf`` registers, for every scheme ``conf/attention/<name>.yaml``, an attention
function (``AttentionInterface.register``) and a mask function of the same name
(``AttentionMaskInterface.register``; without it the library hands the function no mask and
causal and padding masking disappear). Every model family the library converted to its
attention interface (Llama, Mistral, Qwen2, GPT-2, BERT, ...) then runs the scheme in every
attention layer: one nas-run core per layer, built from the scheme's YAML like nas-run's own
model builds it (:class:`nas_cli.model.plan.AttentionPlan`), kept on the layer as ``nas_core``.

How a call is served:

* **Forms.** Self-attention of a layer the library marks ``is_causal`` is nas-run's decoder form
  (``location="decoder"``: causal keys, DNAS's column step over earlier queries only, never a form
  that leaks); other self-attention is the encoder form; cross-attention (BERT or GPT-2 decoders
  with ``add_cross_attention``) is nas-run's cross form (queries generated left to right).
* **Masks.** The mask function gives the library's boolean mask (True = attend) at every call.
  It is read back as nas-run's masks (real keys, real queries, causal) and checked: a mask that
  is not padding (left or right) plus causal, within the layer's sliding window where it has one
  (chunks, packed sequences), is refused in one line. Padded queries give zeros; in self-attention they never enter a column normalizer.
* **Grouped-query attention.** Keys and values are repeated to the query heads
  (``module.num_key_value_groups``), as the library's SDPA path does.
* **Scaling.** nas-run's cores divide scores by sqrt(head_dim); a layer whose ``scaling`` differs
  (GPT-2's ``scale_attn_by_inverse_layer_idx``) gets its queries rescaled to match.
* **UNAS is the library's SDPA.** ``attn_implementation="unas"`` runs the library's own SDPA
  function with the library's own masks (FlashAttention where it applies); its nas-run core
  serves only calls that ask for the weights (``output_attentions``, nas-run's diagnostics).
* **Generation with a KV cache, exact.** With ``use_cache`` a causal layer also keeps, per head
  and cached key, what the scheme carries from query to query (:meth:`AttentionCore.step`: DNAS's
  running column log-sum-exp, one per Sinkhorn iteration); each new query continues from it, so
  cached generation gives the tokens uncached generation gives. A cached prefill (the library's
  default call, training included) computes nothing for it: it keeps references to its queries,
  keys and values, and the state comes from one vectorized pass
  (:meth:`AttentionCore.prefill_state`) when a continuation first needs it; a scheme that carries
  nothing (softmax, kernels, additive) keeps nothing. Beam search's reordering of the
  cache is followed (the state's batch rows are matched to the cached keys). A scheme without a
  one-query step (CODA, CODA-CS, RealFormer) refuses cached generation in one line.
* **Sliding windows and soft-capping** (Mistral, Gemma 2): the layer's ``sliding_window`` and
  ``softcap`` become the core's ``window`` and ``softcap`` (nas_cli/attention/mods.py) for the schemes
  that take them; any other scheme refuses them in one line.
* **The layer input** (gated and forgetting attention's gates): :func:`attach` gives the layer the
  projection nas-run's own model builds, a submodule saved with the model (nas_cli/hf/inputs.py).
* **Cascades.** CODA and RealFormer read the previous layer's attention at the same location:
  :func:`attach` links each layer's core to the one below, and the library's layer order within
  a forward hands it on.
* **Refused, in one line naming the scheme:** schemes that need the model's own cooperation
  (symmetric kernels tie W_q = W_k, positional variants place positions themselves), T5-style
  ``position_bias``, a window or cap for a scheme that takes none, and a scheme with parameters, an
  input projection or a cascade on a model that :func:`attach` has not prepared.

:mod:`nas_cli.hf.models` makes library families nas-run models (``model=hf_llama``, ``hf_gpt2``,
``hf_bert``); docs/huggingface.md has the example, the families that work and the ones that cannot.
"""
from nas_cli.hf.attention import (SUPPORTED, HFAttentionError, attach, attention, build_core, mask_function,  # noqa: F401
                        read_masks, register)

#: the schemes registered by ``import nas_cli.hf``
SCHEMES = register()
