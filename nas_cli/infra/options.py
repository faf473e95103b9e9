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
import math
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Iterable

#: classes whose constructors declare no options of a plug-in (their parameters are not options)
_ROOTS = ("Module", "object", "LightningDataModule", "HyperparametersMixin", "DataHooks", "Callback")


def _constructors(cls: type) -> tuple[list, bool]:
    """(the ``__init__`` functions whose parameters are ``cls``'s options, nearest first: its own and its
    parents' as long as each passes ``**kwargs`` on; whether the chain ends at a root class or at a
    constructor without ``**kwargs``, rather than running out)."""
    inits = []
    for klass in cls.__mro__:
        if klass.__name__ in _ROOTS:
            return inits, True
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        inits.append(init)
        if not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(init).parameters.values()):
            return inits, True
    return inits, False


def declared(cls: type) -> set[str] | None:
    """The option names ``cls(...)`` accepts; None when some constructor takes arbitrary keywords
    that go nowhere declared (nothing can then be checked)."""
    inits, closed = _constructors(cls)
    if not closed:
        return None
    return {p.name for init in inits for p in inspect.signature(init).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"}


def declared_types(cls: type) -> dict[str, Any]:
    """{option: its constructor's annotation} along the same constructors as :func:`declared` (the
    nearest class's annotation wins); an option without an annotation, or one that does not
    evaluate, is left out (its value is then the constructor's to check)."""
    hints: dict[str, Any] = {}
    for init in _constructors(cls)[0]:
        try:
            found = typing.get_type_hints(init, include_extras=True)
        except Exception:  # noqa: BLE001 - an annotation naming what its module does not import
            found = {}
        for name, hint in found.items():
            hints.setdefault(name, hint)
    hints.pop("return", None)
    return hints


def declared_defaults(cls: type) -> dict[str, Any]:
    """{option: its constructor's default} along the same constructors as :func:`declared` (for a
    refusal's example: the value the class would take)."""
    out: dict[str, Any] = {}
    for init in _constructors(cls)[0]:
        for p in inspect.signature(init).parameters.values():
            if p.default is not p.empty:
                out.setdefault(p.name, p.default)
    return out


def import_target(target: str) -> type:
    """The class a ``_target_`` names, imported with the standard library (Hydra's ``get_class``
    logs a traceback-like message of its own when it fails); raises ImportError, AttributeError or
    ValueError when it cannot."""
    import importlib

    module, _, name = str(target).rpartition(".")
    return getattr(importlib.import_module(module), name)


#: the annotations a value is checked against: what YAML and the command line give for each
_KINDS = types.MappingProxyType({
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)),
    bool: ("true or false", lambda v: isinstance(v, bool)),
    str: ("text", lambda v: isinstance(v, str))})


@dataclass(frozen=True)
class Check:
    """A condition on an option beyond its type, declared with the type in the constructor's
    annotation (``batch_size: Annotated[int, Check(lambda v: v > 0, "a positive integer")]``) so
    that the pre-flight reads it there: ``what`` is the whole phrase the one-line refusal says the
    value must be (without "or null", added for an optional option), ``example`` a valid value."""

    test: Callable[[Any], bool]
    what: str
    example: str = "1"


#: the ranges nas-run's own options take (their constructors and sections annotate with these)
PositiveInt = Annotated[int, Check(lambda v: v > 0, "a positive integer")]
Count = Annotated[int, Check(lambda v: v >= 0, "an integer >= 0", "0")]
Fraction = Annotated[float, Check(lambda v: 0 <= v < 1, "a number in [0, 1)", "0.1")]
PositiveNumber = Annotated[float, Check(lambda v: v > 0, "a number > 0", "1e-3")]
NonNegativeNumber = Annotated[float, Check(lambda v: v >= 0, "a number >= 0", "0.0")]


def _parts(hint: Any) -> tuple[list, bool, list[Check]]:
    """(the kinds of _KINDS or other types, whether None is allowed, the Checks) of an annotation:
    a kind, ``Annotated[kind, Check]``, or a union of those and None."""
    checks: list[Check] = []
    if typing.get_origin(hint) is Annotated:
        checks += [m for m in hint.__metadata__ if isinstance(m, Check)]
        hint = typing.get_args(hint)[0]
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    kinds = []
    for m in members:
        if typing.get_origin(m) is Annotated:
            checks += [c for c in m.__metadata__ if isinstance(c, Check)]
            m = typing.get_args(m)[0]
        kinds.append(m)
    return [k for k in kinds if k is not type(None)], type(None) in kinds, checks


def type_problem(value: Any, hint: Any) -> str | None:
    """What ``value`` should be for the annotation ``hint`` ('an integer', 'a number or null', 'a
    positive integer', ...), None when it fits, or when the annotation is not one of int, float, bool
    (alone, in a union with each other and None, or ``Annotated`` with a :class:`Check`): the
    constructor checks the rest."""
    kinds, nullable, checks = _parts(hint)
    if not kinds or any(m not in _KINDS for m in kinds):
        return None
    if value is None and nullable:
        return None
    fits = any(_KINDS[m][1](value) for m in kinds)
    failed = next((c for c in checks if not fits or not c.test(value)), None)
    if fits and failed is None:
        return None
    words = [failed.what] if failed else [_KINDS[m][0] for m in kinds]
    return " or ".join(words + (["null"] if nullable else []))


def example_value(hint: Any) -> str:
    """A valid value of the annotation ``hint`` for a refusal's example."""
    kinds, _, checks = _parts(hint)
    if checks:
        return checks[0].example
    return "2" if int in kinds else "0.5" if float in kinds else "true" if bool in kinds else "name"


def unknown_option_message(where: str, key: str, value: Any, owner: str, options: Iterable[str]) -> str:
    """One line: ``<where>.<key>=<value>: <owner> has no option <key> (did you mean x?); its options: ...``."""
    choices = sorted(options)
    close = difflib.get_close_matches(key, choices, n=1, cutoff=0.6)
    hint = f" (did you mean {where}.{close[0]}?)" if close else ""
    return (f"{where}.{key}={value}: {owner} has no option '{key}'{hint}; its options: "
            f"{', '.join(choices) or 'none'} (from its YAML or the command line)")
