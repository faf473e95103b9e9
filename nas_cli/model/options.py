"""Every option is declared: a scheme's, a task's or a diagnostic plug-in's options are the
parameters of its class's constructor, and a key that is not one stops the run before anything
is made, with the closest declared name.

Why: an option that a constructor swallowed with ``**kwargs`` would be ignored silently: a typo in
a scheme's YAML (``intit: 2.0`` for ``init``) or ``+attention.intit=2`` would train with the default
and look as if it had tested the option. The declared options of a class are the named parameters
of its ``__init__`` and, where that ``__init__`` passes ``**kwargs`` on, of its parents' (up to a
class whose constructor takes no ``**kwargs``; ``torch.nn.Module`` and ``object`` declare nothing).
"""
from __future__ import annotations

import difflib
import inspect
import types
import typing
from typing import Any, Iterable

#: classes whose constructors declare no options of a plug-in (their parameters are not options)
_ROOTS = ("Module", "object", "LightningDataModule", "HyperparametersMixin", "DataHooks", "Callback")


def declared(cls: type) -> set[str] | None:
    """The option names ``cls(...)`` accepts; None when some constructor takes arbitrary keywords
    that go nowhere declared (nothing can then be checked)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass.__name__ in _ROOTS:
            return names
        if "__init__" not in klass.__dict__:
            continue
        params = inspect.signature(klass.__dict__["__init__"]).parameters.values()
        names.update(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                     and p.name != "self")
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return names
    return None


def declared_types(cls: type) -> dict[str, Any]:
    """{option: its constructor's annotation} along the same constructors as :func:`declared` (the
    nearest class's annotation wins); an option without an annotation, or one that does not
    evaluate, is left out (its value is then the constructor's to check)."""
    hints: dict[str, Any] = {}
    for klass in cls.__mro__:
        if klass.__name__ in _ROOTS:
            break
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            found = typing.get_type_hints(init)
        except Exception:  # noqa: BLE001 - an annotation naming what its module does not import
            found = {}
        for name, hint in found.items():
            hints.setdefault(name, hint)
        if not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(init).parameters.values()):
            break
    hints.pop("return", None)
    return hints


#: the annotations a value is checked against: what YAML and the command line give for each
_KINDS = types.MappingProxyType({
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    bool: ("true or false", lambda v: isinstance(v, bool))})


def type_problem(value: Any, hint: Any) -> str | None:
    """What ``value`` should be for the annotation ``hint`` ('an integer', 'a number or null', ...),
    None when it fits, or when the annotation is not one of int, float, bool (alone, or in a union
    with each other and None): the constructor checks the rest."""
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    nullable = type(None) in members
    kinds = [m for m in members if m is not type(None)]
    if not kinds or any(m not in _KINDS for m in kinds):
        return None
    if (value is None and nullable) or any(_KINDS[m][1](value) for m in kinds):
        return None
    return " or ".join([_KINDS[m][0] for m in kinds] + (["null"] if nullable else []))


def unknown_option_message(where: str, key: str, value: Any, owner: str, options: Iterable[str]) -> str:
    """One line: ``<where>.<key>=<value>: <owner> has no option <key> (did you mean x?); its options: ...``."""
    choices = sorted(options)
    close = difflib.get_close_matches(key, choices, n=1, cutoff=0.6)
    hint = f" (did you mean {where}.{close[0]}?)" if close else ""
    return (f"{where}.{key}={value}: {owner} has no option '{key}'{hint}; its options: "
            f"{', '.join(choices) or 'none'} (from its YAML or the command line)")
