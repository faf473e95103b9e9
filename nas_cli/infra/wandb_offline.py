"""Read what W&B wrote for a run, without a server: the run's ``run-<id>.wandb`` file.

Offline runs (nas-run's default) keep config, history and summary only in that
transaction log. It is a LevelDB-style log (32 KiB blocks of records with a 7-byte
header: checksum, length, type) after a 7-byte ``:W&B`` file header, and each record is a
``wandb.proto.wandb_internal_pb2.Record``. Used by the tests and by run comparison.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _chunks(data: bytes) -> Iterator[bytes]:
    if data[:4] != b":W&B":
        raise ValueError("not a W&B transaction log (missing ':W&B' header)")
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # block trailer padding
            pos += left
            continue
        length = int.from_bytes(data[pos + 4: pos + 6], "little")
        kind = data[pos + 6]
        body = data[pos + HEADER: pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            yield body
        elif kind == FIRST:
            pending = body
        elif kind == MIDDLE:
            pending += body
        elif kind == LAST:
            yield pending + body
            pending = b""
        elif kind == 0 and length == 0:  # zero padding up to the block end
            pos += BLOCK - pos % BLOCK if pos % BLOCK else 0


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def read_run(path: str | Path) -> dict[str, Any]:
    """Returns {id, name, group, job_type, tags, config, summary, history} of one run.

    ``path``: the ``run-<id>.wandb`` file or a directory containing one (searched
    recursively, e.g. a nas-run run directory)."""
    from wandb.proto import wandb_internal_pb2 as pb

    path = Path(path)
    if path.is_dir():
        found = sorted(path.rglob("run-*.wandb"))
        if not found:
            raise FileNotFoundError(f"no W&B run file (run-*.wandb) under {path}")
        path = found[-1]
    # the file is named run-<time>-<id>.wandb: the id is known even when the run record never got
    # written (a process killed before W&B flushed it)
    out: dict[str, Any] = {"id": path.stem.rsplit("-", 1)[-1], "config": {}, "summary": {}, "history": [], "tags": []}
    for chunk in _chunks(path.read_bytes()):
        rec = pb.Record()
        rec.ParseFromString(chunk)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            r = rec.run
            out.update(id=r.run_id, name=r.display_name, group=r.run_group, job_type=r.job_type, tags=list(r.tags))
            for item in r.config.update:
                out["config"][_key(item)] = json.loads(item.value_json)
        elif kind == "config":
            for item in rec.config.update:
                out["config"][_key(item)] = json.loads(item.value_json)
        elif kind == "history":
            out["history"].append({_key(i): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "summary":
            for item in rec.summary.update:
                out["summary"][_key(item)] = json.loads(item.value_json)
    return out
