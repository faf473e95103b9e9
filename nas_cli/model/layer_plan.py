"""Per-layer plans: a location's layers, each with its scheme and options, as today's models stack them (Gemma 2/3's
local and global layers, hybrid stacks of a recurrent mixer and softmax attention).

``attention.per_layer`` (or ``attention.<location>.per_layer``) is a list repeated over the location's layers: layer i
runs entry i mod len. An entry is

* ``null``: the location's scheme with its options as they are;
* ``{option: value, ...}``: the location's scheme with these options changed (``{window: null}``: a global layer);
* ``{scheme: <name>, option: value, ...}``: a packaged scheme (its YAML, then these options), or
  ``{_target_: <class>, ...}`` a scheme of the user's.

Five sliding-window layers to one global one, Gemma 3's pattern::

    nas-run task=copy_lm attention.window=64 'attention.per_layer=[null,null,null,null,null,{window:null}]'

A run's label names the pattern, one entry after another with repeats counted: ``unas@w64*5+unas``.
Each entry's options are checked as a location's are, before anything is built.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import groupby
from typing import Any


def describe(scheme: str, options: dict[str, Any]) -> str:
    """One layer's label: the scheme, and its window where it has one (``unas@w64``)."""
    window = options.get("window")
    return f"{scheme}@w{window}" if window is not None else scheme


@dataclass(frozen=True)
class Layered:
    """One location's per-layer pattern: ``entries[i]`` = (scheme, options) of layer i mod len."""

    entries: tuple[tuple[str, dict[str, Any]], ...] = field(default_factory=tuple)

    def at(self, layer: int) -> tuple[str, dict[str, Any]]:
        return self.entries[layer % len(self.entries)]

    @property
    def label(self) -> str:
        runs = [(name, len(list(group))) for name, group in groupby(describe(s, o) for s, o in self.entries)]
        return "+".join(name if n == 1 else f"{name}*{n}" for name, n in runs)


def _entry_error(where: str, i: int, value, why: str) -> ValueError:
    return ValueError(f"{where}.per_layer[{i}]={value!r}: {why}; give null (the location's scheme), {{option: value}} "
                      f"(its options changed, e.g. {{window: null}}) or {{scheme: <name>, ...}} (another scheme)")


def layered(value, scheme: str, options: dict[str, Any], where: str, options_of) -> Layered | None:
    """The pattern ``value`` (``attention.per_layer``) of a location running ``scheme`` with ``options``, or None
    (no per-layer plan). ``options_of(node)`` is the plan's filter of a node's options (what the core is given)."""
    from nas_cli.model.choices import scheme_config
    from omegaconf import OmegaConf

    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}.per_layer={value!r}: give a list repeated over the layers, e.g. "
                         f"'{where}.per_layer=[null,null,null,{{window:null}}]'")
    entries = []
    for i, entry in enumerate(value):
        if entry is None:
            entries.append((scheme, options))
        elif not isinstance(entry, dict):
            raise _entry_error(where, i, entry, "not an entry")
        elif "scheme" in entry or "_target_" in entry:
            own = dict(entry)
            name = own.pop("scheme", None) or str(own.get("name") or own["_target_"].rsplit(".", 1)[-1].lower())
            try:
                base = OmegaConf.to_container(scheme_config(name), resolve=True) if "_target_" not in own else {}
            except ValueError as err:  # an unknown scheme: its line, with the entry that names it
                raise ValueError(f"{where}.per_layer[{i}]: {err}") from None
            if "per_layer" in own:
                raise _entry_error(where, i, entry, "a layer's entry has no per_layer of its own")
            entries.append((name, options_of({**base, **own})))
        else:
            if "per_layer" in entry:
                raise _entry_error(where, i, entry, "a layer's entry has no per_layer of its own")
            entries.append((scheme, options_of({**options, **entry})))
    return Layered(tuple(entries))
