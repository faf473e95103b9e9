"""Documents from local text files, for subword language modelling (tasks/subword_lm.py).

A corpus is a folder (every file under it, in name order) or a list of files and folders. Each file is
read by its form, found from its name (and, for plain text, its first bytes):

* ``.jsonl`` / ``.json``: one JSON object per line, the document in ``task.text_field`` (``text``);
* ``.parquet``: one row per document, the column ``task.text_field`` (read with pyarrow);
* WikiExtractor output (plain text whose first line starts ``<doc ``): one document per ``<doc>`` record,
  its title line left out and title-only records dropped (``../shared/data/wikipedia_en``);
* any other plain text: the whole file one document, or one per line with ``task.text_docs=line``.

Any of them may be compressed (``.gz``, ``.bz2``, ``.xz``): read transparently. A path
``hf://datasets/<owner>/<name>/<file or glob>`` names files of a dataset repository on the Hugging Face hub
(FineWeb-Edu's ``sample/10BT/*.parquet``): downloaded once into the Hugging Face cache, then read as local files. Empty documents are dropped;
a corpus with none, a folder with no readable file, or a file that is not UTF-8 is refused in one line naming
the path (:class:`~tasks.sources.DataError`).
"""
from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
from pathlib import Path
from typing import Iterable, Sequence

from .sources import DataError

OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


def corpus_files(path: str | Sequence[str] | None, option: str = "task.path") -> list[Path]:
    """The files of a corpus: every regular file under each folder (name order, hidden files left out) and
    each file named; refused when a path is missing or nothing is found."""
    if path is None or (not isinstance(path, str) and not list(path)):
        raise DataError(f"{option} is not set: give a folder of text, JSONL or Parquet files, or a list of files")
    out: list[Path] = []
    for item in ([path] if isinstance(path, str) else list(path)):
        if str(item).startswith(HUB):
            out += hub_files(str(item), option)
            continue
        p = Path(str(item)).expanduser()
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file() and not any(part.startswith(".")
                                                                           for part in f.relative_to(p).parts))
        elif p.is_file():
            out.append(p)
        else:
            raise DataError(f"{option}={item}: no such file or folder")
    if not out:
        raise DataError(f"{option}={path}: no files there; give a folder of text, JSONL or Parquet files")
    return out


#: a corpus path on the Hugging Face hub: hf://datasets/<owner>/<name>/<file or glob>
HUB = "hf://datasets/"


def hub_files(item: str, option: str = "task.path") -> list[Path]:
    """The files of a dataset repository on the hub that ``item`` names (a glob: every match, in name order),
    each downloaded once into the Hugging Face cache (``HF_HOME``; ``HF_HUB_OFFLINE=1`` reads it there)."""
    parts = item[len(HUB):].split("/")
    if len(parts) < 3 or not all(parts):
        raise DataError(f"{option}={item}: write hf://datasets/<owner>/<name>/<file or glob>, e.g. "
                        "hf://datasets/HuggingFaceFW/fineweb-edu/sample/10BT/000_00000.parquet")
    repo, pattern = "/".join(parts[:2]), "/".join(parts[2:])
    import logging

    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)  # its retry warnings: the one line below says it
    try:
        from huggingface_hub import HfFileSystem, hf_hub_download

        if any(c in pattern for c in "*?["):
            names = sorted(n.split("/", 3)[3] for n in HfFileSystem().glob(f"datasets/{repo}/{pattern}"))
        else:
            names = [pattern]
        if not names:
            raise DataError(f"{option}={item}: no file of {repo} matches {pattern}")
        return [Path(hf_hub_download(repo, name, repo_type="dataset")) for name in names]
    except DataError:
        raise
    except Exception as err:  # noqa: BLE001 - no network, no such repository or file: one line either way
        reason = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
        raise DataError(f"{option}={item}: cannot read it from the Hugging Face hub ({reason}); with no network, "
                        "download the files and give their folder") from None


def _form(path: Path) -> tuple[str, str | None]:
    """(form, compression suffix) of a file from its name."""
    suffixes = path.suffixes
    packed = suffixes[-1] if suffixes and suffixes[-1] in OPENERS else None
    name = path.name[: -len(packed)] if packed else path.name
    if name.endswith((".jsonl", ".json")):
        return "jsonl", packed
    if name.endswith(".parquet"):
        return "parquet", packed
    return "text", packed


def _text(path: Path, packed: str | None) -> str:
    opener = OPENERS.get(packed) if packed else None
    try:
        raw = opener(path, "rb").read() if opener else path.read_bytes()
    except (OSError, EOFError, lzma.LZMAError) as err:
        raise DataError(f"{path}: cannot be read ({err}); check the file (a {packed or 'text'} file?)") from None
    try:
        return raw.decode("utf-8").replace("\r\n", "\n").lstrip("\ufeff")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text (byte {err.start}); give text, JSONL or Parquet files") from None


def wikiextractor_documents(text: str) -> Iterable[str]:
    """The body of each ``<doc ...>`` record (the title line left out; title-only records give nothing)."""
    for record in text.split("</doc>"):
        start = record.find("<doc ")
        if start < 0:
            continue
        body = record[record.find(">", start) + 1:].strip("\n")
        title, _, rest = body.partition("\n")
        rest = rest.strip()
        if rest:
            yield rest


def file_documents(path: Path, text_field: str = "text", text_docs: str = "file") -> list[str]:
    """The non-empty documents of one file."""
    form, packed = _form(path)
    if form == "parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path if not packed else OPENERS[packed](path, "rb"), columns=[text_field])
        except Exception as err:  # noqa: BLE001 - pyarrow's own errors: one line naming the file
            raise DataError(f"{path}: cannot be read as Parquet with a column '{text_field}' ({str(err)[:120]}); "
                            "set task.text_field to the text column") from None
        return [str(t) for t in table.column(text_field).to_pylist() if t and str(t).strip()]
    text = _text(path, packed)
    if form == "jsonl":
        docs = []
        for i, line in enumerate(text.splitlines()):
            if not line.strip():
                continue
            try:
                value = json.loads(line)[text_field]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise DataError(f"{path}: line {i + 1} is not a JSON object with a '{text_field}' field; set "
                                "task.text_field to the field that holds the text") from None
            if isinstance(value, str) and value.strip():
                docs.append(value)
        return docs
    if text.lstrip().startswith("<doc "):
        return list(wikiextractor_documents(text))
    if text_docs == "line":
        return [line for line in text.splitlines() if line.strip()]
    return [text.strip()] if text.strip() else []


def read_corpus(path, text_field: str = "text", text_docs: str = "file") -> tuple[list[str], list[Path]]:
    """(documents in file order, the files read); refused when there are none."""
    files = corpus_files(path)
    docs: list[str] = []
    for f in files:
        docs += file_documents(f, text_field, text_docs)
    if not docs:
        raise DataError(f"task.path={path}: no document with text in its {len(files)} file(s); check the files "
                        "(and task.text_field for JSONL or Parquet)")
    return docs, files


def files_digest(files: Sequence[Path]) -> str:
    """A digest of the files' names and contents (the token cache's key)."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]
