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
        if pos + HEADER + length > len(data):  # the tail of a file whose writer was killed
            return
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
    recursively, e.g. a nas-run run directory: the newest run there, not one under
    ``wandb/superseded/``)."""
    from wandb.proto import wandb_internal_pb2 as pb

    path = Path(path)
    if path.is_dir():
        found = sorted((p for p in path.rglob("run-*.wandb") if SUPERSEDED not in p.relative_to(path).parts),
                       key=lambda p: p.parent.name.removeprefix("offline-"))  # run-<YYYYmmdd_HHMMSS>-<id>
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


# ---- one W&B run per nas-run run, in offline mode too -------------------------------------------
#: where the offline folders of earlier launches of a resumed run are moved once their history is
#: carried into the newest one (kept, not deleted; ``wandb sync <run dir>/wandb/offline-run-*``
#: does not reach them)
SUPERSEDED = "superseded"


def _records(path: Path, kind: str):
    from wandb.proto import wandb_internal_pb2 as pb

    from google.protobuf.message import DecodeError

    for chunk in _chunks(path.read_bytes()):
        rec = pb.Record()
        try:
            rec.ParseFromString(chunk)
        except DecodeError:  # a record cut short by a kill: what came before it is the history
            return
        if rec.WhichOneof("record_type") == kind:
            yield rec


def _nested_history(path: Path) -> list[dict[str, Any]]:
    """The history rows of one offline run file as they were logged: nested keys (a histogram,
    an image) become the nested dicts W&B serialized them from."""
    rows = []
    for rec in _records(path, "history"):
        row: dict[str, Any] = {}
        for item in rec.history.item:
            keys = [item.key] if item.key else list(item.nested_key)
            node = row
            for k in keys[:-1]:
                node = node.setdefault(k, {})
            node[keys[-1]] = json.loads(item.value_json)
        rows.append(row)
    return rows


def offline_folders(wandb_dir: Path, run_id: str) -> list[Path]:
    """The offline run folders of ``run_id`` directly under ``wandb_dir``, oldest first (W&B names
    them ``offline-run-<YYYYmmdd_HHMMSS>-<id>``)."""
    return sorted(p for p in Path(wandb_dir).glob(f"offline-run-*-{run_id}") if p.is_dir())


#: W&B media a run logs once, at the end of its training (the diagnostics' figures and line series)
END_OF_TRAINING_MEDIA = frozenset({"image-file", "table-file"})


def _ends_a_launch(key: str, value: Any) -> bool:
    """What a launch logs when it finishes, which the launch continuing the run logs anew: the test's
    values and the end-of-training figures. Carried, a run trained longer showed two test results and
    two image sets."""
    return key.startswith("test/") or (isinstance(value, dict) and value.get("_type") in END_OF_TRAINING_MEDIA)


def carry_history(run, wandb_dir: Path, upto_step: int, step_key: str = "trainer/global_step") -> int:
    """Log into ``run`` (a new offline launch of a resumed run) the history the launches before it
    logged up to and including ``upto_step`` (the step of the checkpoint it resumed from: later
    rows are logged again by this launch), with their media, but for what a finished launch logs at
    its end (its test and figures: this launch logs its own); then move those earlier folders to
    ``wandb/superseded/``. The newest offline folder then holds the whole run once, which is what
    ``wandb sync`` uploads (it does not merge offline folders of one id: the last one synced
    replaces the history). Returns the number of rows carried."""
    import shutil

    current = Path(run.dir).parent
    earlier = [p for p in offline_folders(wandb_dir, run.id) if p.resolve() != current.resolve()]
    if not earlier:
        return 0
    source = earlier[-1]  # it carries its own predecessors' rows already
    files = sorted(source.glob("run-*.wandb"))
    rows = _nested_history(files[-1]) if files else []
    media = source / "files" / "media"
    if media.is_dir():  # images are logged by their path inside the run's files/
        shutil.copytree(media, Path(run.dir) / "media", dirs_exist_ok=True)
    carried = 0
    for row in rows:
        step = row.get(step_key)
        if not isinstance(step, (int, float)) or step > upto_step:
            continue
        kept = {k: v for k, v in row.items() if not k.startswith("_") and not _ends_a_launch(k, v)}
        if set(kept) - {step_key}:
            run.log(kept)
            carried += 1
    (Path(wandb_dir) / SUPERSEDED).mkdir(exist_ok=True)
    for folder in earlier:
        folder.rename(Path(wandb_dir) / SUPERSEDED / folder.name)
    return carried
