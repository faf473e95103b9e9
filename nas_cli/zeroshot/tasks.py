"""The zero-shot tasks: lm-evaluation-harness's own task definitions (prompts, choices, metrics), read from
local copies of their data where a folder of them is given, else from the Hugging Face hub as lm-eval reads
them.

A local task keeps lm-eval's YAML as it ships and replaces only where the documents come from
(``custom_dataset``), so the prompts are lm-eval's. The folder's layout is ``../shared/data``'s (each
task's PROVENANCE.md there says how its file relates to the one lm-eval downloads):

=================  ==========================================================  ==================================
task               local files (under the data folder)                          as lm-eval's
=================  ==========================================================  ==================================
lambada_openai     ``lambada_openai/lambada_test.jsonl``                        byte-identical file
piqa               ``piqa/valid.jsonl`` + ``piqa/valid-labels.lst``             the same 1,838 items, joined here
hellaswag          ``hellaswag/hellaswag_val_full.txt.bz2``                     the same 10,042 items, a derived text
                                                                               (close to, not equal to, lm-eval's
                                                                               pre-processing)
boolq              ``boolq/validation/`` (Hugging Face ``save_to_disk``)          the same 3,270 items
=================  ==========================================================  ==================================
"""
from __future__ import annotations

import bz2
import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Callable

from nas_cli.errors import UserError


@dataclass(frozen=True)
class LocalTask:
    yaml: str  # lm-eval's task definition, relative to lm_eval/tasks/
    files: tuple[str, ...]  # relative to the data folder; the first is the one named when missing
    split: str  # the split lm-eval's definition scores
    read: Callable[[Path], list[dict]]  # the data folder -> lm-eval's documents
    fidelity: str  # how the local documents relate to the ones lm-eval downloads


def _lambada(root: Path) -> list[dict]:
    lines = (root / "lambada_openai" / "lambada_test.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _piqa(root: Path) -> list[dict]:
    docs = [json.loads(line) for line in (root / "piqa" / "valid.jsonl").read_text(encoding="utf-8").splitlines()
            if line.strip()]
    labels = [int(x) for x in (root / "piqa" / "valid-labels.lst").read_text().split()]
    if len(labels) != len(docs):
        raise UserError(f"{root / 'piqa'}: valid.jsonl has {len(docs)} items but valid-labels.lst {len(labels)}; "
                        "restore the two files of the PIQA release")
    return [{"goal": d["goal"], "sol1": d["sol1"], "sol2": d["sol2"], "label": y} for d, y in zip(docs, labels)]


def _hellaswag(root: Path) -> list[dict]:
    """Six lines per item: "<activity label>: <context>", the gold ending's index, the four endings."""
    with bz2.open(root / "hellaswag" / "hellaswag_val_full.txt.bz2", "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    docs = []
    for at in range(0, len(lines) - 5, 6):
        docs.append({"context": lines[at], "label": int(lines[at + 1]), "endings": lines[at + 2: at + 6]})
    return docs


def hellaswag_docs(dataset):
    """lm-eval's hellaswag pre-processing (its ``preprocess``) applied to the local file's context line and
    endings: the query, the four choices, the gold index."""
    from lm_eval.tasks.hellaswag.utils import preprocess

    return dataset.map(lambda d: {"query": preprocess(d["context"]),
                                  "choices": [preprocess(e) for e in d["endings"]], "gold": int(d["label"])})


def _boolq(root: Path) -> list[dict]:
    import datasets

    rows = datasets.load_from_disk(str(root / "boolq" / "validation"))
    return [{"passage": r["passage"], "question": r["question"], "label": int(r["answer"])} for r in rows]


LOCAL = MappingProxyType({
    "lambada_openai": LocalTask("lambada/lambada_openai.yaml", ("lambada_openai/lambada_test.jsonl",), "test",
                                _lambada, "the file lm-eval downloads, byte for byte"),
    "piqa": LocalTask("piqa/piqa.yaml", ("piqa/valid.jsonl", "piqa/valid-labels.lst"), "validation", _piqa,
                      "the items lm-eval downloads, in its order"),
    "hellaswag": LocalTask("hellaswag/hellaswag.yaml", ("hellaswag/hellaswag_val_full.txt.bz2",), "validation",
                           _hellaswag, "the items lm-eval downloads from a derived text: contexts and endings "
                           "close to, not equal to, lm-eval's pre-processing (hellaswag/PROVENANCE.md)"),
    "boolq": LocalTask("super_glue/boolq/default.yaml", ("boolq/validation/data-00000-of-00001.arrow",),
                       "validation", _boolq, "the items lm-eval downloads"),
})


def _documents(name: str, root: str, **_):
    """lm-eval's ``custom_dataset`` hook: the local task's documents as a DatasetDict of its one split."""
    import datasets

    spec = LOCAL[name]
    return datasets.DatasetDict({spec.split: datasets.Dataset.from_list(spec.read(Path(root)))})


def parse_names(text: str) -> list[str]:
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    if not names:
        raise UserError("--lm-eval: name one or more lm-eval tasks separated by commas (e.g. "
                        f"--lm-eval {','.join(LOCAL)})")
    return list(dict.fromkeys(names))


def task_specs(names: list[str], data_dir: str | None) -> tuple[list, dict[str, str], object]:
    """lm-eval task configurations for ``names`` (local where ``data_dir`` holds the task's files), what each
    task's documents are (for the record), and the TaskManager that loads them."""
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._yaml_loader import load_yaml
    import lm_eval.tasks

    root = Path(data_dir).expanduser() if data_dir else None
    if root is not None and not root.is_dir():
        raise UserError(f"--lm-eval-data {data_dir}: no such folder (give the folder that holds the tasks' local "
                        f"files, e.g. ../shared/data; {', '.join(LOCAL)} are read from it)")
    remote = [n for n in names if root is None or n not in LOCAL]
    manager = TaskManager() if remote else TaskManager(include_defaults=False)
    unknown = [n for n in remote if n not in manager.all_tasks]
    if unknown:
        raise UserError(f"--lm-eval {unknown[0]}: lm-eval has no such task; the ones read from local files with "
                        f"--lm-eval-data are {', '.join(LOCAL)} (others come from the Hugging Face hub: "
                        "lm-eval --tasks list names them)")
    specs, sources = [], {}
    for name in names:
        if name in remote:
            specs.append(name)
            sources[name] = "the Hugging Face hub (lm-eval's own download)"
            continue
        spec = LOCAL[name]
        missing = [f for f in spec.files if not (root / f).exists()]
        if missing:
            raise UserError(f"--lm-eval {name}: its local file {root / missing[0]} is missing (the folder "
                            f"--lm-eval-data {data_dir} must hold {', '.join(spec.files)}); leave --lm-eval-data "
                            "out to read the task from the hub")
        config = load_yaml(Path(lm_eval.tasks.__file__).parent / spec.yaml, resolve_func=True)
        config.pop("tag", None)
        config.update(custom_dataset=functools.partial(_documents, name, str(root)), training_split=None,
                      dataset_kwargs=None)
        if name == "hellaswag":
            config["process_docs"] = hellaswag_docs
        specs.append(config)
        sources[name] = f"{', '.join(str(root / f) for f in spec.files)}: {spec.fidelity}"
    return specs, sources, manager


def items_digest(names: list[str], data_dir: str | None, limit) -> str:
    """What identifies the scored items: the tasks, their local files' contents (or the hub) and the limit;
    nas-report compares per-item outputs only between evaluations of the same items."""
    h = hashlib.sha256(json.dumps([names, limit]).encode())
    for name in names:
        spec = LOCAL.get(name)
        if data_dir and spec:
            for f in spec.files:
                with open(Path(data_dir).expanduser() / f, "rb") as fh:
                    h.update(hashlib.file_digest(fh, "sha256").digest())
        else:
            h.update(f"hub:{name}".encode())
    return h.hexdigest()
