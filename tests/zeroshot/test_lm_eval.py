"""Zero-shot evaluation with lm-evaluation-harness (nas_cli/zeroshot/): nas-run's lm-eval model gives the same
per-item log-likelihoods as lm-eval's own HFLM on the same Hugging Face model, and as plain PyTorch on nas-run's
own Transformer (left truncation included); the local tasks pose lm-eval's published prompts; greedy generation
stops where lm-eval's ``until`` says."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from datafiles import SHARED, zero_shot_data

pytest.importorskip("lm_eval")

from tasks.subword_lm import SubwordLMTask  # noqa: E402

WORDS = ("the model reads a long text about rivers cities and music in many places over years while people "
         "write question answer yes no because").split()


@pytest.fixture(scope="module")
def subword_task(tmp_path_factory):
    root = tmp_path_factory.mktemp("zs")
    rng = np.random.default_rng(0)
    docs = [" ".join(rng.choice(WORDS, size=int(rng.integers(20, 60)))) + "." for _ in range(80)]
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    task = SubwordLMTask(path=str(root / "docs.jsonl"), vocab_size=400, valid_docs=5, test_docs=5,
                         tokens_per_sample=64, cache_dir=str(root / "cache"))
    task.setup()
    return task


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return zero_shot_data(tmp_path_factory.mktemp("zsdata"))


def _hf_llama(task, max_len=512):
    from helpers import compose_cfg

    from nas_cli.hf.models import build_hf_model
    from nas_cli.model.plan import AttentionPlan

    cfg = compose_cfg("model=hf_llama", "task=wikitext2", "model.d_model=32", "model.heads=2", "model.kv_heads=1",
                      "model.decoder_layers=2", "model.ffn=64", f"model.max_len={max_len}")
    torch.manual_seed(0)
    return build_hf_model(cfg.model, AttentionPlan.for_job(cfg).model_cores(cfg.model), task).eval()


def _responses(samples):
    return {name: [[r[0] if isinstance(r, (list, tuple)) else r for r in s["filtered_resps"]]
                   for s in sorted(records, key=lambda s: s["doc_id"])] for name, records in samples.items()}


def test_loglikelihoods_equal_lm_evals_own_hflm_on_the_same_llama(subword_task, data):
    from lm_eval import evaluator
    from lm_eval.models.huggingface import HFLM
    from transformers import PreTrainedTokenizerFast

    from nas_cli.zeroshot.harness import zero_shot
    from nas_cli.zeroshot.tasks import task_specs

    model = _hf_llama(subword_task)
    names = ["lambada_openai", "piqa"]
    ours = zero_shot(model, subword_task, names, str(data), limit=12, batch_size=5, max_length=384)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=subword_task.tokenizer, eos_token="</s>", pad_token="<pad>")
    hflm = HFLM(pretrained=model.hf, tokenizer=tokenizer, batch_size=7, max_length=384, device="cpu")
    specs, _, manager = task_specs(names, str(data))
    theirs = evaluator.simple_evaluate(model=hflm, tasks=specs, task_manager=manager, limit=12, log_samples=True,
                                       bootstrap_iters=0)
    a, b = _responses(ours["samples"]), _responses(theirs["samples"])
    for name in names:
        assert len(a[name]) == len(b[name]) == 12
        got, want = np.array(a[name], dtype=float), np.array(b[name], dtype=float)
        assert got == pytest.approx(want, abs=1e-4)
    assert ours["metrics"]["test/zeroshot/piqa/acc"] == pytest.approx(theirs["results"]["piqa"]["acc,none"])

    # rolling log-likelihoods (lm-eval's disjoint windows) over a text longer than the window
    from lm_eval.api.instance import Instance

    from nas_cli.zeroshot.lm import NasLM

    text = " ".join(WORDS * 4)
    requests = [Instance("loglikelihood_rolling", {}, (text,), 0), Instance("loglikelihood_rolling", {}, ("rivers",), 1)]
    mine = NasLM(model, subword_task, batch_size=3, max_length=64).loglikelihood_rolling(requests)
    hflm._max_length = 64
    theirs = hflm.loglikelihood_rolling(requests)
    assert mine == pytest.approx(theirs, abs=1e-4)
    assert len(subword_task.tokenizer.encode(text).ids) > 64  # more than one window was scored


def test_scores_equal_plain_pytorch_on_nas_runs_transformer_with_left_truncation(subword_task):
    from helpers import compose_cfg
    from lm_eval.api.instance import Instance

    from nas_cli.model.plan import AttentionPlan
    from nas_cli.pipeline.lit import build_model
    from nas_cli.zeroshot.lm import NasLM
    from tasks.base import EOS

    cfg = compose_cfg("task=wikitext2", "attention=dnas", "model.positions=rope", "model.d_model=32", "model.heads=2",
                      "model.decoder_layers=2", "model.ffn=64", "model.dropout=0")
    torch.manual_seed(1)
    model = build_model(cfg.model, AttentionPlan.for_job(cfg).model_cores(cfg.model), subword_task).eval()
    lm = NasLM(model, subword_task, batch_size=2, max_length=24)
    pairs = [(" ".join(WORDS[:30]), " rivers and music"), ("people write", " yes"), ("", "the model")]
    got = lm.loglikelihood([Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)])

    def encode(text):
        return [i + subword_task.offset for i in subword_task.tokenizer.encode(text).ids]

    for (context, continuation), (ll, greedy) in zip(pairs, got):
        whole = encode(context + continuation) if context else [EOS] + encode(continuation)
        n_cont = len(whole) - (len(encode(context)) if context else 1)
        row = whole[-(24 + 1):]  # the last 24 inputs and the token after them
        with torch.no_grad():
            logits, _ = model(torch.tensor([row[:-1]]))
        logp = torch.log_softmax(logits[0].double(), -1)
        targets = row[-n_cont:]
        positions = range(len(row) - 1 - n_cont, len(row) - 1)
        want = sum(float(logp[p, t]) for p, t in zip(positions, targets))
        assert ll == pytest.approx(want, abs=1e-4)
        assert greedy == all(int(logp[p].argmax()) == t for p, t in zip(positions, targets))
    assert len(encode(pairs[0][0] + pairs[0][1])) > 25  # the first pair was truncated on the left

    # a continuation longer than the window: pieces of at most 24 tokens, each after the 24 tokens before its end
    context, continuation = "people write", " " + " ".join(WORDS * 3)
    (ll, _), = lm.loglikelihood([Instance("loglikelihood", {}, (context, continuation), 0)])
    whole, n_ctx = encode(context + continuation), len(encode(context))
    assert len(whole) - n_ctx > 24
    want = 0.0
    for start in range(n_ctx, len(whole), 24):
        end = min(start + 24, len(whole))
        row = whole[:end][-25:]
        with torch.no_grad():
            logits, _ = model(torch.tensor([row[:-1]]))
        logp = torch.log_softmax(logits[0].double(), -1)
        want += sum(float(logp[len(row) - 1 - (end - t), whole[t]]) for t in range(start, end))
    assert ll == pytest.approx(want, abs=1e-4)


def test_greedy_generation_stops_at_until_and_cuts_there(subword_task):
    from lm_eval.api.instance import Instance

    from nas_cli.zeroshot.lm import NasLM

    model = _hf_llama(subword_task)
    lm = NasLM(model, subword_task, max_length=64)
    free = lm.generate_until([Instance("generate_until", {}, ("the model reads", {"until": [], "max_gen_toks": 8}), 0)])[0]
    ids = [i + subword_task.offset for i in subword_task.tokenizer.encode("the model reads").ids]
    with torch.no_grad():
        for _ in range(8):  # greedy by hand: the argmax after the whole prefix, 8 times
            logits, _ = model(torch.tensor([ids]))
            logits[0, -1, 0] = -math.inf
            ids.append(int(logits[0, -1].argmax()))
    by_hand = subword_task.ids_to_text(ids[-8:])
    assert free == by_hand
    stop = by_hand.strip().split(" ")[1] if len(by_hand.strip().split(" ")) > 1 else by_hand.strip()[:2]
    cut = lm.generate_until([Instance("generate_until", {}, ("the model reads", {"until": [stop], "max_gen_toks": 8}),
                                      0)])[0]
    assert cut == by_hand.split(stop)[0]


def test_local_tasks_pose_lm_evals_published_prompts(data):
    """The prompts of lm-eval's task definitions (transcribed from its YAML files, lm-eval 0.4.13) on the first
    items of the local files; with ../shared/data, every item is there."""
    from lm_eval.tasks import TaskManager

    from nas_cli.zeroshot.tasks import LOCAL, task_specs

    specs, _, manager = task_specs(list(LOCAL), str(data))
    built = manager.load(specs)["tasks"]
    lambada = built["lambada_openai"]
    doc = lambada.test_docs()[0]
    assert lambada.doc_to_text(doc) == doc["text"].rsplit(" ", 1)[0]
    assert lambada.doc_to_target(doc) == " " + doc["text"].rsplit(" ", 1)[1]
    piqa = built["piqa"]
    doc = piqa.validation_docs()[0]
    assert piqa.doc_to_text(doc) == f"Question: {doc['goal']}\nAnswer:"
    assert piqa.doc_to_choice(doc) == [doc["sol1"], doc["sol2"]] and piqa.doc_to_target(doc) == doc["label"]
    boolq = built["boolq"]
    doc = boolq.validation_docs()[0]
    assert boolq.doc_to_text(doc) == f"{doc['passage']}\nQuestion: {doc['question']}?\nAnswer:"
    assert boolq.doc_to_choice(doc) == ["no", "yes"] and boolq.doc_to_target(doc) in (0, 1)
    hella = built["hellaswag"]
    doc = hella.validation_docs()[0]
    assert len(hella.doc_to_choice(doc)) == 4 and hella.doc_to_target(doc) == doc["gold"]
    assert "[" not in hella.doc_to_text(doc) and "  " not in hella.doc_to_text(doc)  # lm-eval's preprocess ran
    if data == SHARED:  # the published sizes
        assert [len(built[n].eval_docs) for n in ("lambada_openai", "piqa", "hellaswag", "boolq")] == \
            [5153, 1838, 10042, 3270]
        assert built["piqa"].validation_docs()[0]["goal"] == "How do I ready a guinea pig cage for it's new occupants?"
    assert isinstance(manager, TaskManager)
