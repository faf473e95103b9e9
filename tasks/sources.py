"""Where a task's raw text comes from, checked so that bad data fails with one clear line.

Three kinds of source, chosen by ``task.source``:

* ``local`` (a directory in the fairseq-style raw layout): translation
  ``<split>.<lang>`` line-aligned pairs, language modelling ``<split>.txt``, headline
  generation ``<split>.<src>`` / ``<split>.<tgt>`` (article / title) line files;
* ``disk`` (a ``datasets.save_to_disk`` directory, a DatasetDict with one Dataset per split);
* ``hub`` (a Hugging Face dataset name, downloaded once and cached by ``datasets``).

Every source returns plain lists of strings per split, so tokenization and batching do
not care where text came from.
"""
from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path
from typing import Sequence

from nas_cli.errors import UserError

from .base import note


class DataError(UserError):
    """Missing or malformed data; the message names the path and the fix."""


def existing(path: Path) -> Path:
    """``path``, or ``path.gz`` when only the gzip-compressed file is there."""
    gz = path.with_name(path.name + ".gz")
    return gz if not path.is_file() and gz.is_file() else path


def _not_found(path: Path, what: str) -> DataError:
    return DataError(f"{what}: file {path} not found (nor {path.name}.gz); check task.path and the split "
                     "names (task.splits)")


def _empty(path: Path, what: str) -> DataError:
    return DataError(f"{what}: file {path} is empty; it should hold one sentence per line")


def _not_utf8(path: Path, what: str, raw: bytes, start: int) -> DataError:
    line = raw[:start].count(b"\n") + 1
    return DataError(f"{what}: file {path} is not valid UTF-8 (byte {start}, line {line}); "
                     "re-encode it as UTF-8 (e.g. iconv -t UTF-8)")


#: how much of a data file :func:`check_text_file` reads before anything is made
HEAD_BYTES = 1 << 16


def check_text_file(path: Path, what: str) -> None:
    """Before the run directory is made: the file (or its ``.gz``) is there, is not empty, and
    starts as UTF-8 text (its first 64 KiB; :func:`read_lines` reads it whole later)."""
    path = existing(path)
    if not path.is_file():
        raise _not_found(path, what)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                head = f.read(HEAD_BYTES)
        else:
            with open(path, "rb") as f:
                head = f.read(HEAD_BYTES)
    except (OSError, EOFError) as err:
        raise DataError(f"{what}: file {path} cannot be read ({getattr(err, 'strerror', None) or err})") from None
    if not head.strip():
        raise _empty(path, what)
    if b"\0" in head:
        raise DataError(f"{what}: file {path} is binary (NUL bytes), not text with one sentence per line; "
                        "check task.path")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(head) - 4 or len(head) < HEAD_BYTES:  # not a character cut at the end of the chunk
            raise _not_utf8(path, what, head, err.start) from None


def read_lines(path: Path, what: str) -> list[str]:
    """Read a UTF-8 text file (or its ``.gz``) as a list of lines (without newlines).

    Windows line endings (CRLF) and a UTF-8 byte-order mark are normalized away, with one line
    on stderr saying so: left in, ``\\r`` and ``\\ufeff`` would become parts of tokens."""
    path = existing(path)
    if not path.is_file():
        raise _not_found(path, what)
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as err:
            raise DataError(f"{what}: file {path} is not a readable gzip file ({err}); re-compress or unpack it") \
                from None
    if not raw.strip():
        raise _empty(path, what)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _not_utf8(path, what, raw, err.start) from None
    fixed = []
    if text.startswith("\ufeff"):
        text = text[1:]
        fixed.append("removed a UTF-8 byte-order mark")
    if "\r" in text:
        crlf = text.count("\r\n")
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        fixed.append(f"converted Windows line endings (CRLF) to \\n ({crlf} lines)" if crlf
                     else "converted old Mac line endings (CR) to \\n")
    if fixed:
        note(f"{path}: {'; '.join(fixed)}")
    return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")


def check_dir(path: str | Path | None, option: str = "task.path") -> Path:
    if path is None or str(path) in ("", "None"):
        raise DataError(f"{option} is not set; point it at the data directory (or set task.source=hub)")
    p = Path(str(path)).expanduser()
    if not p.is_dir():
        raise DataError(f"{option}={p} is not a directory; download or unpack the data there, or set {option}")
    return p


def count_lines(path: Path, what: str) -> int:
    """The number of lines :func:`read_lines` gives for ``path`` (or its ``.gz``), counted in chunks
    without decoding (the whole file is read only when it has a carriage return)."""
    path = existing(path)
    opener = gzip.open if path.suffix == ".gz" else open
    count, last, cr = 0, b"", False
    with opener(path, "rb") as f:
        while chunk := f.read(1 << 22):
            count += chunk.count(b"\n")
            cr = cr or b"\r" in chunk
            last = chunk[-1:]
    if cr:  # CR line endings count as read_lines converts them (it says so when it reads the file)
        with opener(path, "rb") as f:
            raw = f.read().replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        count, last = raw.count(b"\n"), raw[-1:]
    return count + (1 if last and last != b"\n" else 0)


def check_parallel(root: Path, split_file: str, src: str, tgt: str) -> None:
    """Before the run directory is made: both sides of a split have one line per sentence pair."""
    a = count_lines(root / f"{split_file}.{src}", "source side")
    b = count_lines(root / f"{split_file}.{tgt}", "target side")
    if a != b:
        raise _mismatch(root, split_file, src, tgt, a, b)


def _mismatch(root, split_file, src, tgt, a: int, b: int) -> DataError:
    return DataError(f"{root / split_file}.{src} has {a} lines but {root / split_file}.{tgt} has {b}; "
                     "a parallel pair needs one sentence per line on both sides")


def local_parallel(root: Path, split_file: str, src: str, tgt: str) -> tuple[list[str], list[str]]:
    """``<root>/<split_file>.<src>`` and ``.<tgt>``: equal numbers of lines required."""
    a = read_lines(root / f"{split_file}.{src}", "source side")
    b = read_lines(root / f"{split_file}.{tgt}", "target side")
    if len(a) != len(b):
        raise _mismatch(root, split_file, src, tgt, len(a), len(b))
    return a, b


def disk_split(root: Path, split: str, columns: Sequence[str]) -> list[list[str]]:
    """Columns of one split of a ``datasets.save_to_disk`` DatasetDict.

    A column may be a dotted path into a nested record ('translation.de')."""
    from datasets import DatasetDict, load_from_disk

    try:
        dd = load_from_disk(str(root))
    except (FileNotFoundError, ValueError) as err:
        raise DataError(f"task.path={root} is not a dataset saved with datasets.save_to_disk ({err})") from None
    if not isinstance(dd, DatasetDict) or split not in dd:
        have = list(dd.keys()) if isinstance(dd, DatasetDict) else "a single Dataset"
        raise DataError(f"task.path={root}: no split '{split}' (found {have}); set task.splits")
    return _columns(dd[split], columns, f"task.path={root} split '{split}'")


def hub_reachable(host: str = "huggingface.co", timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers at all (one TCP connection, a few seconds at most),
    unless HF_HUB_OFFLINE / HF_DATASETS_OFFLINE already say it must not be used."""
    import socket

    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0") or \
            os.environ.get("HF_DATASETS_OFFLINE", "0") not in ("", "0"):
        return False
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def check_hub_source(task: str, name: str, config: str | None, cache_dir: str, local_files: str) -> None:
    """Before anything is made: a task reading a Hugging Face dataset can get it, from the hub (it answers)
    or from the local hub cache (the dataset's folder is there); else one line saying where it looked."""
    if hub_reachable():
        return
    folder = str(name).replace("/", "___")
    if any(Path(cache_dir).glob(f"{folder}*")) or any(Path(cache_dir).glob(f"*/{folder}*")):
        return
    which = f"'{name}'" + (f" ({config})" if config else "")
    raise DataError(f"task '{task}' has no task.path, so it reads the Hugging Face dataset {which}; "
                    f"the hub does not answer and {cache_dir} holds no copy of it: give the data as files with "
                    f"task.path=<dir with {local_files}>")


def hub_split(name: str, config: str | None, split: str, columns: Sequence[str], cache_dir: str | None) -> list[list[str]]:
    """A split of a hub dataset. Without network, only the local hub cache is tried (the
    datasets library would otherwise retry for about 30 seconds before failing)."""
    if not hub_reachable():
        os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    from datasets import config as hf_config
    from datasets import load_dataset

    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    if offline:  # the library read its settings at import: tell it too
        hf_config.HF_HUB_OFFLINE = hf_config.HF_DATASETS_OFFLINE = True
    try:
        ds = load_dataset(name, config, split=split, cache_dir=cache_dir)
    except Exception as err:  # network, unknown name, missing config: one line either way
        if offline:
            raise DataError(f"no network and no local copy of the Hugging Face dataset '{name}' ({config}) split "
                            f"'{split}' in {cache_dir}: give the data as files with task.path=<dir> (or run once "
                            "with network to cache it)") from None
        raise DataError(f"could not load Hugging Face dataset '{name}' ({config}) split '{split}': "
                        f"{str(err).splitlines()[0] if str(err) else type(err).__name__}; offline? use task.source=local "
                        "with task.path") from None
    return _columns(ds, columns, f"dataset '{name}' split '{split}'")


def _columns(ds, columns, what) -> list[list[str]]:
    out = []
    for col in columns:
        head, *rest = col.split(".")
        if head not in ds.column_names:
            raise DataError(f"{what}: no column '{head}' (found {ds.column_names}); set task.columns")
        values = ds[head]
        for key in rest:
            values = [v[key] for v in values]
        out.append([str(v) for v in values])
    return out


def fingerprint(*parts) -> str:
    """Stable hash of data files (by size and mtime) and settings, for on-disk caches."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            part = existing(part)
        if isinstance(part, Path) and part.exists():
            st = part.stat()
            h.update(f"{part.resolve()}:{st.st_size}:{int(st.st_mtime)}".encode())
        else:
            h.update(repr(part).encode())
    return h.hexdigest()[:16]


def resolve_source(source: str, path, hf_name, task: str, local_files: str) -> str:
    """Where a task's data come from: ``task.source`` when given (local, disk or hub), else
    ``disk`` for a save_to_disk folder at ``path``, ``local`` for raw files there, ``hub`` when only
    ``hf_name`` is set. ``local_files`` says, in the error, what a local folder holds."""
    if source != "auto":
        if source not in ("local", "disk", "hub"):
            raise DataError(f"task.source must be auto, local, disk or hub (got '{source}')")
        return source
    if path:
        return "disk" if (Path(str(path)).expanduser() / "dataset_dict.json").is_file() else "local"
    if hf_name:
        return "hub"
    raise DataError(f"task '{task}' has no data: set task.path=<dir with {local_files}> (or a save_to_disk "
                    "folder) or task.hf_name=<dataset>")

