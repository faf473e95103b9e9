"""Secrets never reach a file: keys that look like secrets are dropped from saved configs and
masked in override strings and recorded command lines, at any depth and in any form of
override (``+logger.auth={token:...}``, ``+logger.api_key="a b"``, list values)."""
from __future__ import annotations

import contextlib
import re
import sys
from pathlib import Path
from types import MappingProxyType
from typing import Iterator

from omegaconf import OmegaConf

from nas_cli.infra.atomic import atomic_write


#: a key is a secret when a word of its last name contains one of these (``*key*``, ``*secret*``, ...)
SECRET_WORDS = ("key", "secret", "password", "passwd", "credential")


def _secret_word(w: str) -> bool:
    return any(s in w for s in SECRET_WORDS) or w.endswith("token")  # hf_token, accessToken; not detokenize


def is_secret(key: str) -> bool:
    """The documented rule, at every depth: a key whose last name has a word containing key, secret,
    password or credential, or ending in token (``logger.api_key``, ``keys``, ``authkey``,
    ``accessToken``, ``hf_token``, ``password``); ``max_tokens`` and ``detokenize`` are not (and a
    section such as ``logger.auth={token: ..., user: me}`` keeps its other entries)."""
    last = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", str(key).rsplit(".", 1)[-1]).lower()
    return any(_secret_word(w) for w in re.split(r"[^a-z0-9]+", last.lstrip("+~")) if w)


_KEY = re.compile(r"([+~]{0,2}[A-Za-z_][\w.@/-]*)\s*([=:])\s*")


def _value_end(text: str, j: int) -> int:
    """End of the value that starts at ``text[j]``: a quoted string, a {...} or [...] (nested,
    quotes respected), or a plain token up to ``,``, ``}``, ``]`` or white space."""
    n = len(text)
    if j < n and text[j] in "\"'":
        quote, k = text[j], j + 1
        while k < n and text[k] != quote:
            k += 2 if text[k] == "\\" else 1
        return min(k + 1, n)
    if j < n and text[j] in "{[":
        depth, k = 0, j
        while k < n:
            c = text[k]
            if c in "\"'":
                k = _value_end(text, k)
                continue
            depth += c in "{["
            depth -= c in "}]"
            k += 1
            if depth == 0:
                return k
        return n
    k = j
    while k < n and text[k] not in ",}] \t\n":
        k += 1
    return k


def _redact_text(text: str) -> str:
    """``key=value`` and ``key: value`` pairs of secret keys masked, at any depth of an override
    (``+logger.auth={token:abc}``, ``+logger.api_key="a b"``, ``+keys=[a,b]``)."""
    out, i = [], 0
    while True:
        m = _KEY.search(text, i)
        if m is None:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:m.start()])
        if is_secret(m.group(1)):
            out.append(f"{m.group(1)}{m.group(2)}***")
            i = _value_end(text, m.end())
        else:  # keep the key; keep scanning inside its value (nested dicts)
            out.append(text[m.start():m.end()])
            i = m.end()


#: Hydra's own text in its saved files (hydra.yaml, multirun.yaml), never a user's value: its help
#: templates, whose ``key=value`` is an example of the command line
_HYDRA_TEXT = (("hydra", "help"), ("hydra", "hydra_help"))
#: Hydra's own keys whose names look secret and hold none: override_dirname's list of key names
_HYDRA_KEYS = MappingProxyType({("hydra", "job", "config", "override_dirname"): ("exclude_keys",)})


def redact(node, path: tuple = ()):
    """A config tree (dict/list/str) with secret keys dropped at any depth and secret values in
    strings (Hydra's override lists, recorded command lines) masked as ``key=***``; Hydra's own help
    text and its ``exclude_keys`` are kept as they are (``path``: the keys above ``node``)."""
    if isinstance(node, dict):
        kept = _HYDRA_KEYS.get(path, ())
        return {k: redact(v, (*path, str(k))) for k, v in node.items() if k in kept or not is_secret(k)}
    if isinstance(node, (list, tuple)):
        return [redact(v, path) for v in node]
    if isinstance(node, str):
        return node if path[:2] in _HYDRA_TEXT else _redact_text(node)
    return node


#: text in which no key can be secret has none of these, in any case (:func:`is_secret` lowers each key's
#: name and looks for them in it): such a file need not be parsed (about 0.05 s a run on 2 CPU cores,
#: every run of a sweep)
_MAY_BE_SECRET = re.compile("|".join((*SECRET_WORDS, "token")), re.IGNORECASE)


def redact_files(*paths: Path) -> None:
    """Rewrite Hydra's saved YAML files (config, hydra, overrides, multirun) without secrets."""
    for path in paths:
        if not path.is_file() or not _MAY_BE_SECRET.search(path.read_text(encoding="utf-8", errors="replace")):
            continue
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        clean = redact(data)
        if clean != data:
            atomic_write(path, lambda tmp, clean=clean: OmegaConf.save(OmegaConf.create(clean), tmp))


@contextlib.contextmanager
def redacted_argv() -> Iterator[None]:
    """W&B records the command line (``sys.argv``) with a run: show it secret overrides masked."""
    saved = sys.argv
    sys.argv = [redact(a) for a in saved]
    try:
        yield
    finally:
        sys.argv = saved
