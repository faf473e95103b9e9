"""``nas-report --baseline SELECTOR``: which group is the baseline of which.

A selector is ``field=value[,field=value...]`` over the grouping fields of
:func:`~nas_cli.report.table.field_value` (``scheme=unas``, ``placement.encoder=unas,heads=4``). One that
matches one group makes it every other group's baseline; one that matches several (a grid) gives each group
the baseline at its own values of the fields on which the baselines differ (:class:`Baselines`). A
selector without ``variant`` chooses among trained groups; where nas-eval results of one kind (``eval:<name>``)
exist for the baseline and other groups, those are compared with the baseline's result of that kind
(:func:`select_baselines`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from nas_cli.report.table import Group, field_value


class CompareError(ValueError):
    """Bad --baseline / --metrics input, or runs that cannot be compared (one line for the user)."""


def parse_selector(text: str) -> dict[str, str]:
    out = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise CompareError(f"--baseline {text!r}: expected field=value[,field=value], e.g. scheme=unas")
        out[key.strip()] = value.strip()
    if not out:
        raise CompareError("--baseline needs field=value, e.g. scheme=unas")
    return out


def _matches(group: Group, selector: dict[str, str]) -> bool:
    return all(all(str(field_value(r, k)) == v for r in group.runs) for k, v in selector.items())


@dataclass
class Baselines:
    """What ``--baseline SELECTOR`` chose: each system group with its baseline group. A selector
    that matches one group: every other group against it. One that matches several (``scheme=unas``
    on a grid over heads): each group against the baseline at the same values of every field on
    which the baselines differ (``matched_on``, e.g. model.heads), which is the pairing of
    ``seed=auto`` (nas_cli.sweeps.design.pair_up)."""

    pairs: list[tuple[Group, Group]]  # (system, its baseline)
    groups: list[Group]  # the baseline groups
    matched_on: list[str]
    unmatched: list[Group]  # systems with no baseline at their values of matched_on

    @property
    def label(self) -> str:
        if len(self.groups) == 1:
            return self.groups[0].label
        return f"{' / '.join(g.label for g in self.groups)} (each at the same {', '.join(self.matched_on)})"


def coordinates(group: Group) -> dict[str, str]:
    """The values that place a group in a grid: the run fields, its --group-by fields and, for the
    default grouping, every config key of its setup."""
    run = group.runs[0]
    out = {"task": run.task, "scheme": run.scheme, "heads": run.heads, "variant": _variant(group),
           **{f"placement.{k}": v for k, v in run.placement.items()}, **group.fields}
    if group.key and group.key[0] == "config":
        out.update(dict(group.key[2]))
    return {k: repr(v) for k, v in out.items()}


def select_baselines(groups: Sequence[Group], text: str) -> Baselines:
    """The baseline group(s) of ``text`` and each other group's own (see :class:`Baselines`)."""
    selector = parse_selector(text)
    found = [g for g in groups if _matches(g, selector)]
    of_kind: dict[str, Group] = {}
    if len(found) > 1 and "variant" not in selector:  # the trained runs, not their nas-eval results
        trained = [g for g in found if _variant(g) is None]
        if len(trained) == 1:
            of_kind = _evaluation_baselines(found, groups)
            found = trained
        # several trained baselines (one per cell of a grid): their nas-eval results stay baselines too, each
        # group matched with the baseline of its cell and its kind (the variant is one of the coordinates)
    if not found:
        labels = "; ".join(g.label for g in groups)
        raise CompareError(f"--baseline {text}: no group matches; the groups are: {labels}")
    others = [g for g in groups if all(g is not b for b in found)]
    if len(found) == 1:
        return Baselines([(g, of_kind.get(_variant(g), found[0]) if g is not of_kind.get(_variant(g)) else found[0])
                          for g in others], found, [], [])
    coords = {id(g): coordinates(g) for g in groups}
    keys = [*dict.fromkeys(k for b in found for k in coords[id(b)] if k not in selector)]
    varying, partitions = [], set()
    for k in keys:  # run fields first: 'heads', not also the config key 'model.heads' that says the same
        values = [coords[id(b)].get(k) for b in found]
        partition = tuple(values.index(v) for v in values)
        if len(set(values)) > 1 and partition not in partitions:
            varying.append(k)
            partitions.add(partition)
    index: dict[tuple, Group] = {}
    for b in found:
        key = tuple(coords[id(b)].get(k) for k in varying)
        if key in index:
            raise CompareError(f"--baseline {text}: {index[key].label} and {b.label} match it with the same "
                               "settings; add fields to the selector (e.g. scheme=unas,model=tiny) or --group-by")
        index[key] = b
    pairs, unmatched = [], []
    for g in others:
        b = index.get(tuple(coords[id(g)].get(k) for k in varying))
        (pairs.append((g, b)) if b is not None else unmatched.append(g))
    if not pairs:
        raise CompareError(f"--baseline {text}: no other group shares a baseline's {', '.join(varying)}; the "
                           f"baselines are {'; '.join(b.label for b in found)}")
    return Baselines(pairs, found, varying, unmatched)


def _variant(group: Group) -> str | None:
    kinds = {r.variant for r in group.runs}
    return next(iter(kinds)) if len(kinds) == 1 else None


def _evaluation_baselines(found: Sequence[Group], groups: Sequence[Group]) -> dict[str, Group]:
    """{kind: the baseline's nas-eval result of that kind} for the kinds (``eval:lm_eval``) other groups also
    have: those groups are compared with it (a zero-shot score with the baseline's zero-shot score), and it with
    the trained baseline. A kind only the baseline has (one run re-evaluated) is compared with the trained one."""
    out = {}
    for g in found:
        kind = _variant(g)
        same = [b for b in found if _variant(b) == kind]
        if kind is not None and len(same) == 1 and any(_variant(o) == kind for o in groups if o not in found):
            out[kind] = g
    return out


def select_baseline(groups: Sequence[Group], text: str) -> Group:
    """The one group ``text`` selects (refused, naming them, when it selects several)."""
    chosen = select_baselines(groups, text)
    if len(chosen.groups) > 1:
        raise CompareError(f"--baseline {text}: {len(chosen.groups)} groups match "
                           f"({'; '.join(g.label for g in chosen.groups)}); add fields to the selector, "
                           "e.g. scheme=unas,heads=4")
    return chosen.groups[0]
