"""The one way nas-run writes a file that someone may read or that a crash may interrupt:
into a temporary file next to it (named with the process id, so two writers never share
one), then ``os.replace`` onto the final name. Readers see the old file or the new one,
never half of either; a failed write leaves the old file as it was and no temporary behind.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable


def temporary_name(path: Path) -> Path:
    """``.<name>.<pid>.tmp`` beside ``path`` (hidden, and matched by ``*.tmp`` clean-ups)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def atomic_write(path: str | Path, write: Callable[[Path], None], fsync: bool = False) -> Path:
    """Call ``write(tmp)`` to fill a temporary file, then move it onto ``path``.

    ``fsync=True`` flushes the file to disk before the rename (checkpoints: a power loss
    after the rename must not leave an empty file under the final name)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        write(tmp)
        if fsync:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine (another user's process counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_stale_temporaries(root: str | Path) -> list[Path]:
    """Remove, under ``root``, the temporary files (:func:`temporary_name`) of writers that are gone: a
    process killed (SIGKILL, the out-of-memory killer, a node lost) between writing one and renaming it
    leaves it behind. A file whose writer still runs, or this process's own, is kept. The removed files."""
    removed = []
    for tmp in Path(root).rglob(".*.tmp"):
        pid = tmp.name[:-len(".tmp")].rpartition(".")[2]
        if not pid.isdigit() or int(pid) == os.getpid() or process_alive(int(pid)):
            continue
        try:
            tmp.unlink()
            removed.append(tmp)
        except FileNotFoundError:
            pass
    return removed


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | Path, data: Any, indent: int | None = 2, **dump_kwargs) -> Path:
    dump_kwargs.setdefault("default", str)
    return atomic_write_text(path, json.dumps(data, indent=indent, **dump_kwargs))
