"""task=subword_lm: documents from every supported form, held-out documents, a trained byte-level BPE or a
given tokenizer.json, the token cache reused, and the bits per byte and loss by position of a trained run
recomputed from its checkpoint with plain PyTorch over the same windows. Bad inputs are one line."""
from __future__ import annotations

import bz2
import gzip
import json
import math

import numpy as np
import pytest
import torch
from helpers import nas_run

from tasks.documents import read_corpus
from tasks.sources import DataError
from tasks.subword_lm import SubwordLMTask, held_out, position_buckets, token_bytes, train_bpe

WORDS = ("the model reads a long text about rivers cities and music in many places over years while people "
         "write about köln zürich and 東京 as well").split()


def _docs(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(20, 80)))) + "." for _ in range(n)]


def test_every_form_of_file_is_read_as_its_documents(tmp_path):
    docs = _docs(6)
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in docs[:2]) + "\n")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": docs[2]}) + "\n")
    (tmp_path / "c.txt").write_text(docs[3])
    with bz2.open(tmp_path / "d.txt.bz2", "wt") as f:
        f.write(f'<doc id="1" url="?" title="T">\nT\n\n{docs[4]}\n</doc>\n<doc id="2" url="?" title="E">\nE\n\n</doc>\n')
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [docs[5], ""]}), tmp_path / "e.parquet")
    found, files = read_corpus(str(tmp_path))
    assert found == docs and len(files) == 5  # in file order; the title-only record and the empty row dropped


def test_held_out_documents_are_disjoint_seeded_and_sized():
    a, b = held_out(1000, 0.01, 25, 7), held_out(1000, 0.01, 25, 7)
    assert all(np.array_equal(a[s], b[s]) for s in a)
    assert len(a["valid"]) == 10 and len(a["test"]) == 25 and len(a["train"]) == 965
    assert len(set(np.concatenate(list(a.values())))) == 1000
    with pytest.raises(DataError, match="task.valid_docs and task.test_docs"):
        held_out(3, 2, 2, 1)


def test_each_tokens_bytes_add_up_to_the_documents_utf8_bytes():
    docs = _docs(30)
    tok = train_bpe(docs, 300)
    for d in docs:
        enc = tok.encode(d)
        assert int(token_bytes(d, enc.offsets).sum()) == len(d.encode("utf-8"))
        assert tok.decode(enc.ids) == d  # byte-level: the text comes back exactly


def _corpus(tmp_path, n=120):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "docs.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in _docs(n)) + "\n")
    return folder


def test_the_token_cache_is_written_once_and_reused(tmp_path):
    folder = _corpus(tmp_path)
    options = dict(path=str(folder), vocab_size=300, valid_docs=10, test_docs=10, tokens_per_sample=32,
                   cache_dir=str(tmp_path / "cache"))
    first = SubwordLMTask(**options)
    first.setup()
    second = SubwordLMTask(**options)
    second.setup()
    assert not first.cache_hit and second.cache_hit and first.cache_folder == second.cache_folder
    assert np.array_equal(first.streams["test"], second.streams["test"])
    meta = json.loads((first.cache_folder / "meta.json").read_text())
    assert meta["splits"]["test"]["documents"] == 10
    texts = [d for d in _docs(120)]
    test_docs = [texts[i] for i in held_out(120, 10, 10, 1234)["test"]]
    assert meta["splits"]["test"]["bytes"] == sum(len(d.encode()) + 1 for d in test_docs)  # + one per EOD
    # another tokenizer, another cache folder; a given tokenizer.json is shifted past PAD, BOS, EOS
    tok = train_bpe(_docs(50, 3), 280)
    tok.save(str(tmp_path / "tokenizer.json"))
    given = SubwordLMTask(**{**options, "tokenizer": str(tmp_path / "tokenizer.json")})
    given.setup()
    assert given.cache_folder != first.cache_folder and given.src_vocab_size == 280 + 3
    assert given.streams["train"].min() >= 2  # EOS (2) and shifted ids only


def test_packed_windows_span_documents_and_unpacked_ones_never_do(tmp_path):
    folder = _corpus(tmp_path, 60)
    options = dict(path=str(folder), vocab_size=300, valid_docs=5, test_docs=5, tokens_per_sample=16,
                   cache_dir=str(tmp_path / "cache"))
    packed, apart = SubwordLMTask(**options, pack=True), SubwordLMTask(**options, pack=False)
    packed.setup(), apart.setup()
    bounds = apart.bounds["train"]
    for s, e, _ in apart._windows("train", 16, None):
        doc = np.searchsorted(bounds, s, side="right") - 1
        assert bounds[doc] <= s and e <= bounds[doc + 1]  # inside one document
    crossing = [w for w in packed._windows("train", 16, None)
                if np.searchsorted(bounds, w[0], side="right") != np.searchsorted(bounds, w[1] - 1, side="right")]
    assert crossing


@pytest.mark.parametrize("options,message", [
    (dict(path="{missing}"), "no such file or folder"),
    (dict(path="{empty}"), "no files there"),
    (dict(path="{blank}"), "no document with text"),
    (dict(path="{corpus}", tokenizer="{bad_tokenizer}"), "not a tokenizer.json that HF tokenizers can read"),
    (dict(path="{corpus}", vocab_size=100), "below the byte alphabet"),
])
def test_bad_corpora_and_tokenizers_are_one_line(tmp_path, options, message):
    places = {"missing": tmp_path / "nope", "empty": tmp_path / "empty", "blank": tmp_path / "blank",
              "corpus": _corpus(tmp_path), "bad_tokenizer": tmp_path / "tokenizer.json"}
    places["empty"].mkdir()
    places["blank"].mkdir()
    (places["blank"] / "a.txt").write_text("\n\n")
    places["bad_tokenizer"].write_text("{not json")
    given = {k: v.format(**places) if isinstance(v, str) else v for k, v in options.items()}
    with pytest.raises((DataError, ValueError), match=message) as err:
        task = SubwordLMTask(**given, cache_dir=str(tmp_path / "cache"))
        task.check_data()
        task.setup()
    assert "\n" not in str(err.value)


@pytest.mark.slow  # a trained run
def test_bits_per_byte_and_loss_by_position_equal_a_plain_recomputation(tmp_path):
    folder = _corpus(tmp_path)
    run = tmp_path / "run"
    proc = nas_run("task=subword_lm", f"task.path={folder}", "task.vocab_size=300", "task.valid_docs=10",
                   "task.test_docs=10", "task.tokens_per_sample=32", f"task.cache_dir={tmp_path / 'cache'}",
                   "debug=fast", "logger=csv", f"hydra.run.dir={run}", "model.max_len=64", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    test = summary["test"]
    assert {f"test/pos_loss_{lo}_{hi}" for lo, hi in position_buckets(32)} <= set(test)
    # the same windows (debug=fast: the first 2 test batches of 16), scored with plain PyTorch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from nas_cli.infra.resume import load_safe
    from nas_cli.model.plan import AttentionPlan
    from nas_cli.pipeline.lit import build_model

    cfg = OmegaConf.load(run / ".hydra" / "config.yaml")
    task = instantiate(cfg.task)
    task.setup()
    model = build_model(cfg.model, AttentionPlan.for_job(cfg).model_cores(cfg.model), task)
    state = load_safe(run / "checkpoints" / "best.ckpt")["state_dict"]
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})
    model.eval()
    nll_sum, nbytes = 0.0, 0
    buckets = {}
    loader = task.test_dataloader()
    for i, batch in zip(range(2), loader):
        with torch.no_grad():
            logits, _ = model(batch["ids"])
        logp = torch.log_softmax(logits.double(), -1)
        for r in range(batch["ids"].size(0)):
            for c in range(batch["ids"].size(1)):
                t = int(batch["target"][r, c])
                if t == 0:
                    continue
                loss = -float(logp[r, c, t])
                nll_sum += loss
                nbytes += int(batch["target_bytes"][r, c])
                lo = 0 if c == 0 else 2 ** int(math.log2(c))
                buckets.setdefault(lo, []).append(loss)
    assert test["test/bpb"] == pytest.approx(nll_sum / (math.log(2) * nbytes), rel=1e-4)
    for lo, hi in position_buckets(32):
        assert test[f"test/pos_loss_{lo}_{hi}"] == pytest.approx(np.mean(buckets[lo]), rel=1e-4)
    # the passkey grid of the trained model, in its held-out text
    from helpers import run_command, script

    out = run_command([script("nas-eval"), str(run), "--passkey", "--passkey-lengths", "96,128",
                       "--passkey-samples", "2"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    record = json.loads((run / "eval" / "passkey.json").read_text())
    grid = record["passkey"]
    assert grid["lengths"] == [96, 128] and len(grid["accuracy"][0]) == 5
    assert (run / "eval" / "passkey_heatmap.png").is_file()
    # nas-report's numbers: each length's share over its depths, each cell's, and the probes' 0/1 behind them
    items = json.loads((run / "eval" / "passkey.items.json").read_text())
    assert items["refs_sha256"] == grid["probes_sha256"]
    for i, n in enumerate(grid["lengths"]):
        assert record["metrics"][f"test/passkey/{n}"] == pytest.approx(np.mean(grid["accuracy"][i]))
        assert items["passkey"][f"test/passkey/{n}/depth50"] == grid["retrieved"][i][2]
        assert np.mean(items["passkey"][f"test/passkey/{n}/depth50"]) == grid["accuracy"][i][2]


def test_passkey_probes_hold_the_needle_at_its_depth_and_the_key_at_the_end(tmp_path, monkeypatch):
    from nas_cli.pipeline import passkey

    task = SubwordLMTask(path=str(_corpus(tmp_path, 200)), vocab_size=300, valid_docs=10, test_docs=60,
                         tokens_per_sample=32, cache_dir=str(tmp_path / "cache"))
    task.setup()
    rng = np.random.default_rng(0)
    ids, k = passkey.probes(task, 128, 50, 3, rng)
    assert ids.shape == (3, 128) and k >= 1
    text = task.tokenizer.decode([int(i) - task.offset for i in ids[0]])
    key = text.rsplit(" ", 1)[-1]
    assert len(key) == 5 and key.isdigit() and f"The pass key is {key}. Remember it." in text
    where = task.tokenizer.decode([int(i) - task.offset for i in ids[0][:64]])
    assert "pass key" in text and abs(len(where) / len(text) - 0.5) < 0.25  # the needle near the middle

    # an oracle that knows each probe's next token retrieves everything; a constant model nothing
    seen = []
    real = passkey.probes
    monkeypatch.setattr(passkey, "probes", lambda *a: seen.append(real(*a)) or seen[-1])

    class Oracle(torch.nn.Module):
        def forward(self, x):
            full = seen[-1][0]
            return torch.nn.functional.one_hot(full[:, 1:x.size(1) + 1], task.src_vocab_size).float(), None

    grid = passkey.passkey_grid(Oracle(), task, [96, 128], depths=(0, 100), samples=2)
    assert grid["accuracy"] == [[1.0, 1.0], [1.0, 1.0]]
    constant = lambda x: (torch.zeros(*x.shape, task.src_vocab_size), None)  # noqa: E731
    grid = passkey.passkey_grid(type("M", (torch.nn.Module,), {"forward": lambda self, x: constant(x)})(), task,
                                [96], depths=(50,), samples=2)
    assert grid["accuracy"] == [[0.0]]
