"""Hugging Face model families as nas-run models (model=hf_llama, hf_gpt2): trained by nas-run's
own Lightning module through the real nas-run command (Hydra, Lightning, W&B offline), with
nas-run's checkpoints, resume and diagnostics."""
import json

import pytest
import torch

pytest.importorskip("transformers")

from helpers import compose_cfg, nas_run  # noqa: E402

SMALL = ["task=copy_lm", "model.d_model=32", "model.ffn=64", "model.decoder_layers=2", "model.heads=2",
         "task.train_size=1000", "task.val_size=64", "task.test_size=64", "trainer.val_check_interval=10",
         "progress_bar=false"]


@pytest.mark.slow  # a run stopped and resumed
def test_nas_run_trains_hf_llama_with_diagnostics_in_wandb_and_resumes(tmp_path):
    from nas_cli.infra.wandb_offline import read_run

    run = tmp_path / "run"
    proc = nas_run("model=hf_llama", "attention=hnas", "model.kv_heads=1", *SMALL, "trainer.max_steps=20", "log_learned_every=5",
                   "trainer.log_every_n_steps=5",
                   f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["model"] == "hf_llama" and summary["steps"] == 20 and 1 < summary["test"]["test/ppl"] < 30
    # HNAS's u, one per layer and head, in the summary, the diagnostics and W&B
    assert {"u/decoder/L0/h0", "u/decoder/L1/h1"} <= set(summary["learned"])
    diag = json.loads((run / "diagnostics" / "summary.json").read_text())
    dec = diag["locations"]["decoder"]
    assert dec["layers"] == 2 and 0 <= dec["jsd_mean"] and "u_mean" in dec and dec["neg_log_sk"] < 0
    assert (run / "diagnostics" / "u_trajectories.png").is_file()
    logged = set().union(*map(set, read_run(run / "wandb")["history"]))
    assert {"diag/decoder/jsd_mean", "diag/decoder/min_margin", "u/decoder/L0/h0"} <= logged
    # nas-run's checkpoints: continue the run to 30 steps from its last checkpoint
    more = nas_run(f"resume={run}", "trainer.max_steps=30", cwd=tmp_path)
    assert more.returncode == 0, more.stderr[-3000:]
    again = json.loads((run / "summary.json").read_text())
    assert again["steps"] == 30 and again["resumed_from"]


def test_hf_llama_trains_gated_attention_with_its_input_projection(tmp_path, scheme="gated"):
    """The gate's projection of the layer input is the model's: trained, saved in the checkpoint, and the run
    tested from it (forgetting attention's, the same projection, in tests/hf/test_hf.py)."""
    run = tmp_path / "run"
    proc = nas_run("model=hf_llama", f"attention={scheme}", *SMALL, "trainer.max_steps=10", "logger=csv",
                   "diagnostics.plots=never", f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["scheme"] == scheme and summary["test"]["test/ppl"] > 1
    state = torch.load(run / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    assert sum(k.endswith("self_attn.nas_x_proj.weight") for k in state) == 2  # one per layer


def test_hf_gpt2_trains_with_dnas_and_the_adaptive_softmax(tmp_path):
    """model=hf_gpt2 with nas-run's adaptive softmax in place of the library's output layer (the
    WikiText-2 preset's, here on copy_lm's 20 symbols)."""
    run = tmp_path / "run"
    proc = nas_run("model=hf_gpt2", "attention=dnas", *SMALL, "model.adaptive_softmax={cutoffs:[8,14],div_value:2}",
                   "optim.label_smoothing=0", "trainer.max_steps=10", "logger=csv", f"hydra.run.dir={run}",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["model"] == "hf_gpt2" and summary["scheme"] == "dnas" and summary["test"]["test/ppl"] > 1


@pytest.mark.parametrize("family", ["hf_llama", "hf_gpt2"])
def test_adaptive_softmax_over_the_librarys_hidden_states(family):
    """HFCausalLM with model.adaptive_softmax: forward gives normalized log-probabilities, the
    training path's target_log_prob equals them at the targets, and the diagnostics' weights come
    through the same features."""
    from nas_cli.pipeline.lit import build_model
    from nas_cli.model.plan import AttentionPlan

    cfg = compose_cfg(f"model={family}", "attention=dnas", "model.adaptive_softmax={cutoffs:[8,14],div_value:2}",
                      *[a for a in SMALL if a.startswith(("model.", "task="))])
    task = type("T", (), {"kind": "lm", "src_vocab_size": 20, "pad_id": 0})()
    model = build_model(cfg.model, AttentionPlan.from_config(cfg.attention).model_cores(cfg.model), task).double().eval()
    assert model.adaptive
    ids = torch.tensor([[3, 4, 5, 6, 7, 0], [7, 8, 9, 10, 11, 12]])
    logp, attn = model(ids, need_weights=True)
    assert logp.shape == (2, 6, 20) and torch.allclose(logp.logsumexp(-1), torch.zeros((), dtype=logp.dtype))
    h, _ = model.features(ids)
    target = torch.tensor([4, 5, 6, 7, 19, 1])
    got = model.target_log_prob(h[0], target)
    assert torch.allclose(got, logp[0].gather(1, target[:, None]).squeeze(1))
    assert len(attn["decoder"]) == 2 and attn["decoder"][0].weights.shape == (2, 2, 6, 6)


@pytest.mark.parametrize("args,words", [
    (["attention=pe_lookup"], "attention=pe_lookup cannot run inside model=hf_llama: it places positions itself"),
    (["attention=differential", "model.heads=3"], "model.heads=3 must be even"),
    (["task=sort"], "model=hf_llama is a decoder-only language model: use it with a language-model task"),
    (["model=hf_bert"], "model=hf_bert is an encoder-decoder: use it with a translation task"),
    (["model.family=t5"], "model.family=t5 is not a Hugging Face family nas-run maps; choose one of llama, gpt2, bert"),
])
def test_bad_combinations_are_refused_before_anything_is_made(args, words):
    """The checks nas-run runs on the composed config before any data, model or W&B run exists."""
    from nas_cli.pipeline.checks.config import check_attention
    from nas_cli.errors import UserError

    model = [] if any(a.startswith("model=") for a in args) else ["model=hf_llama"]
    task = [] if any(a.startswith("task=") for a in args) else ["task=copy_lm"]
    with pytest.raises(UserError) as err:
        check_attention(compose_cfg(*model, *task, *args))
    assert "\n" not in str(err.value) and words in str(err.value)


def test_a_bad_combination_is_one_line_and_exit_2_from_the_command(tmp_path):
    proc = nas_run("model=hf_llama", "task=sort", "trainer.max_steps=1", f"hydra.run.dir={tmp_path / 'r'}",
                   cwd=tmp_path)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "model=hf_llama is a decoder-only language model: use it with a language-model task" in lines[0]
    assert not (tmp_path / "r" / "summary.json").exists()


def test_diagnostics_read_the_registered_functions_weights():
    """HFCausalLM(need_weights=True) hands on, per layer, the weights the registered function
    returned: they equal nas-run's core on the library's q/k (rows sum to 1, causal)."""
    from omegaconf import OmegaConf

    from nas_cli.pipeline.lit import build_model
    from nas_cli.model.plan import AttentionPlan

    cfg = compose_cfg("model=hf_llama", "attention=dnas", *[a for a in SMALL if a.startswith(("model.", "task="))])
    task = type("T", (), {"kind": "lm", "src_vocab_size": 20, "pad_id": 0})()
    model = build_model(cfg.model, AttentionPlan.from_config(cfg.attention).model_cores(cfg.model), task).double().eval()
    ids = torch.tensor([[3, 4, 5, 6, 0, 0], [7, 8, 9, 10, 11, 12]])
    captured = []
    layer = model.hf.model.layers[1].self_attn
    layer.register_forward_hook(lambda m, a, kw, out: captured.append(out), with_kwargs=True)
    logits, attn = model(ids, need_weights=True)
    w = attn["decoder"][1].weights  # (B, H, T, T)
    real = ids != 0
    assert w.shape == (2, 2, 6, 6) and torch.allclose(w.sum(-1)[real[:, None].expand(-1, 2, -1)],
                                                      torch.ones((), dtype=w.dtype))
    assert torch.equal(w.triu(1), torch.zeros_like(w))  # causal: no weight on a later key
    assert torch.equal(captured[0][1], w)  # the very tensor the layer's attention function returned
    assert OmegaConf.select(cfg, "model.family") == "llama"


def test_paper_size_preset_is_llama2_7b_shape():
    from transformers import AutoModelForCausalLM

    from nas_cli.hf.models import hf_config

    cfg = compose_cfg("model=hf_llama_7b", "task=wikitext2")
    config = hf_config(cfg.model, 32000, 0)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.intermediate_size,
            config.num_key_value_heads, config.max_position_embeddings) == (4096, 32, 32, 11008, 32, 4096)
    with torch.device("meta"):  # no memory: count the parameters of the shape
        model = AutoModelForCausalLM.from_config(config, attn_implementation="dnas")
    n = sum(p.numel() for p in model.parameters())
    assert n == 6_738_415_616  # Llama 2 7B's published count


def test_hf_bert_translates_with_a_scheme_per_location(tmp_path):
    """model=hf_bert: a BERT encoder and a BERT decoder with cross-attention, each location with
    the plan's scheme (here DNAS, and UNAS in cross-attention), greedy-decoded by nas-run and
    diagnosed at all three locations."""
    run = tmp_path / "run"
    proc = nas_run("task=reverse", "model=hf_bert", "attention=dnas", "attention.cross=unas", "model.d_model=32",
                   "model.ffn=64", "model.encoder_layers=1", "model.decoder_layers=1", "model.heads=2",
                   "task.train_size=1000", "task.val_size=32", "task.test_size=32", "trainer.max_steps=10",
                   "trainer.val_check_interval=10", "logger=csv", "progress_bar=false", f"hydra.run.dir={run}",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["model"] == "hf_bert" and summary["scheme"] == "enc-dnas_dec-dnas_cross-unas"
    assert "test/bleu" in summary["test"]
    diag = json.loads((run / "diagnostics" / "summary.json").read_text())
    assert set(diag["locations"]) == {"encoder", "decoder", "cross"}
    assert diag["locations"]["encoder"]["min_margin"] >= -1e-6  # DNAS's floor (Theorem 2) in the encoder


def _pair(cross: str = "dnas"):
    from nas_cli.pipeline.lit import build_model
    from nas_cli.model.plan import AttentionPlan

    cfg = compose_cfg("task=reverse", "model=hf_bert", "attention=dnas", f"attention.cross={cross}",
                      "model.d_model=32", "model.ffn=64", "model.encoder_layers=2", "model.decoder_layers=2",
                      "model.heads=2")
    task = type("T", (), {"kind": "seq2seq", "src_vocab_size": 20, "tgt_vocab_size": 20, "pad_id": 0})()
    torch.manual_seed(0)
    return build_model(cfg.model, AttentionPlan.from_config(cfg.attention).model_cores(cfg.model), task).double().eval()


def test_hf_pair_never_lets_a_target_position_see_the_future():
    """Decoder self-attention (causal DNAS) and cross-attention (DNAS's prefix form over decoder
    queries): changing later target tokens leaves every earlier position's logits unchanged."""
    model = _pair()
    src = torch.tensor([[5, 6, 7, 8, 0], [9, 10, 11, 12, 13]])
    tgt = torch.tensor([[1, 4, 5, 6, 7, 8], [1, 9, 10, 11, 12, 13]])
    base, _ = model(src, tgt)
    for t in range(1, tgt.shape[1] - 1):
        changed = tgt.clone()
        changed[:, t + 1:] = (changed[:, t + 1:] * 3 + 1) % 20
        out, _ = model(src, changed)
        assert torch.equal(out[:, :t + 1], base[:, :t + 1]), t


def test_hf_pair_greedy_decoding_equals_teacher_forcing():
    model = _pair()
    src = torch.tensor([[5, 6, 7, 8, 0], [9, 10, 11, 12, 13]])
    out = model.greedy_decode(src, 1, 2, max_len=6)
    tgt_in = torch.cat([torch.ones(2, 1, dtype=torch.long), out[:, :-1]], dim=1)
    logits, _ = model(src, tgt_in)
    logits[..., [0, 1]] = float("-inf")  # greedy never emits padding or BOS
    forced = logits.argmax(-1)
    for row in range(2):
        n = int((out[row] != 0).sum())  # up to and including EOS
        assert torch.equal(forced[row, :n], out[row, :n])


def test_hf_pair_beam_search_scores_are_its_tokens_log_probabilities():
    """nas-run's beam search over the pair (the decoder re-run on each prefix): each returned
    hypothesis's score is the sum of its tokens' log-probabilities under teacher forcing."""
    from nas_cli.model.decoding import beam_search

    model = _pair()
    src = torch.tensor([[5, 6, 7, 8, 0], [9, 10, 11, 12, 13]])
    tokens, scores = beam_search(model, src, 1, 2, 0, beam=3, max_len=6, lenpen=0.0)
    tgt_in = torch.cat([torch.ones(2, 1, dtype=torch.long), tokens[:, :-1]], dim=1)
    logits, _ = model(src, tgt_in)
    logp = torch.log_softmax(logits.float(), -1).gather(-1, tokens[..., None]).squeeze(-1)
    for row in range(2):
        n = int((tokens[row] != 0).sum())
        assert float(scores[row]) == pytest.approx(float(logp[row, :n].sum()), abs=1e-4)


def test_a_per_layer_plan_runs_each_layers_scheme_inside_the_library_model():
    """attention.per_layer in model=hf_llama: every layer runs its own core (a sigmoid layer is not the library's SDPA),
    with the full padding mask in every call (left padding changes no real position's logits)."""
    from nas_cli.model.plan import AttentionPlan
    from nas_cli.pipeline.lit import build_model

    cfg = compose_cfg("model=hf_llama", "attention.per_layer=[null,{scheme:sigmoid}]",
                      *[a for a in SMALL if a.startswith(("model.", "task="))])
    task = type("T", (), {"kind": "lm", "src_vocab_size": 20, "pad_id": 0})()
    torch.manual_seed(0)
    model = build_model(cfg.model, AttentionPlan.from_config(cfg.attention).model_cores(cfg.model), task).double().eval()
    layers = model.hf.model.layers
    assert [layer.self_attn.nas_core.name for layer in layers] == ["unas", "sigmoid"]
    assert model.hf.config._attn_implementation == "sigmoid"
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
    padded = torch.tensor([[0, 0, 3, 4, 5, 6, 7, 8]])
    torch.testing.assert_close(model(padded)[0][:, 2:], model(ids)[0])
    sigmoid_out = model(ids)[0]
    layers[1].self_attn.nas_core = layers[0].self_attn.nas_core  # the same weights, softmax in both layers
    assert not torch.allclose(model(ids)[0], sigmoid_out)
