"""Document masking for packed windows (task.document_mask, nas_cli/model/documents.py): with every scheme, a window
that joins documents gives each document's positions the outputs that document gets when run alone; without it
a later document's outputs depend on the earlier one. A trained run with the option reaches its summary."""
from __future__ import annotations

import json

import pytest
import torch
from helpers import nas_run
from test_model import SIZES, factory, positions_for

from nas_cli.model.documents import split_documents
from nas_cli.model.transformer import DecoderOnlyLM

PAD, EOS = 0, 2


def _corpus(tmp_path, n):
    folder = tmp_path / "corpus"
    folder.mkdir()
    words = "the model reads a long text about rivers cities and music in many places".split()
    gen = torch.Generator().manual_seed(0)
    docs = [" ".join(words[int(i)] for i in torch.randint(0, len(words), (int(torch.randint(10, 40, (1,),
                     generator=gen)),), generator=gen)) + "." for _ in range(n)]
    (folder / "docs.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in docs) + "\n")
    return folder


def test_documents_become_rows_and_padding_stays_with_the_last():
    ids = torch.tensor([[5, 6, EOS, 7, EOS, 8, 9],
                        [5, 6, 7, EOS, PAD, PAD, PAD]])
    docs = split_documents(ids, EOS, PAD)
    assert docs.rows.tolist() == [[5, 6, EOS, PAD, PAD, PAD, PAD], [7, EOS, PAD, PAD, PAD, PAD, PAD],
                                  [8, 9, PAD, PAD, PAD, PAD, PAD], [5, 6, 7, EOS, PAD, PAD, PAD]]
    assert docs.row.tolist() == [[0, 0, 0, 1, 1, 2, 2], [3, 3, 3, 3, 3, 3, 3]]
    assert docs.at.tolist() == [[0, 1, 2, 0, 1, 0, 1], [0, 1, 2, 3, 4, 5, 6]]
    assert torch.equal(docs.back(docs.rows), ids)  # every position comes back to its place


def _windows():
    torch.manual_seed(0)
    a, b, c = (torch.randint(3, 20, (n,)) for n in (4, 3, 5))
    a[-1], b[-1] = EOS, EOS  # a and b end in the window, c runs past its end
    d = torch.randint(3, 20, (12,))
    return torch.stack([torch.cat([a, b, c]), d]), [(0, 0, a), (0, 4, b), (0, 7, c), (1, 0, d)]


def test_each_packed_document_gets_the_outputs_it_gets_alone_with_every_scheme(scheme):
    torch.manual_seed(1)
    options = {**SIZES, "positions": positions_for(scheme)}
    lm = DecoderOnlyLM(20, factory(scheme), decoder_layers=2, document_end=EOS, **options).eval()
    plain = DecoderOnlyLM(20, factory(scheme), decoder_layers=2, **options).eval()
    plain.load_state_dict(lm.state_dict())
    ids, documents = _windows()
    with torch.no_grad():
        packed, _ = lm(ids)
        unmasked, _ = plain(ids)
        for window, start, doc in documents:
            alone, _ = plain(doc[None])
            torch.testing.assert_close(packed[window, start:start + len(doc)], alone[0], rtol=1e-5, atol=1e-5)
        # without the mask the second document sees the first (its outputs differ from its own alone)
        second_alone, _ = plain(documents[1][2][None])
    assert not torch.allclose(unmasked[0, 4:7], second_alone[0], atol=1e-4)


def test_the_diagnostics_read_the_documents_rows():
    lm = DecoderOnlyLM(20, factory("unas"), decoder_layers=1, document_end=EOS, **SIZES).eval()
    ids, _ = _windows()
    _, attn = lm(ids, need_weights=True)
    rows = lm.attention_rows(ids)
    assert attn["decoder"][0].weights.shape == (rows.size(0), 4, rows.size(1), rows.size(1))
    assert rows.size(0) == 4  # three documents in the first window, one in the second


@pytest.mark.slow  # a trained run
def test_a_run_with_document_masking_reaches_its_summary(tmp_path):
    folder = _corpus(tmp_path, n=60)
    run = tmp_path / "run"
    proc = nas_run("task=subword_lm", f"task.path={folder}", "task.vocab_size=300", "task.valid_docs=6",
                   "task.test_docs=6", "task.tokens_per_sample=64", "task.document_mask=true",
                   f"task.cache_dir={tmp_path / 'cache'}", "debug=fast", "logger=csv", f"hydra.run.dir={run}",
                   "model.max_len=64", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["test"]["test/bpb"] > 0
    # the diagnostics read each document's row with its own mask: every real query's weights sum to one
    assert summary["diagnostics"]["decoder"]["row_mass"] == pytest.approx(1.0, abs=1e-6)


def test_hugging_face_models_refuse_it_in_one_line(tmp_path):
    folder = _corpus(tmp_path, n=30)
    proc = nas_run("task=subword_lm", f"task.path={folder}", "task.vocab_size=300", "task.valid_docs=3", "task.test_docs=3",
                   "task.document_mask=true",
                   "model=hf_llama", f"task.cache_dir={tmp_path / 'cache'}", "debug=fast",
                   f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 2 and "task.document_mask=true runs each packed document" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
