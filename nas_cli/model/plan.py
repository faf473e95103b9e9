"""The attention plan: which scheme runs at each location, with which options, built once.

Hydra composes it. ``attention=<scheme>`` picks the scheme of every location and puts its
YAML (``_target_`` and options) at ``attention``; a location that runs another scheme is a
second choice of the same config group placed at that location's package:

    nas-run attention=hnas attention.decoder=unas attention.cross=unas

``attention.<location>=<scheme>`` is nas-run's short spelling of Hydra's package override
``attention@attention.<location>=<scheme>`` (rewritten by :func:`location_alias` before Hydra
parses the command line), so that scheme's YAML is composed by Hydra too: it comes from the
config search path (a user's ``hydra.searchpath`` folder included), command-line options reach
it (``attention.decoder.dropout=0.1``), and the run's saved ``.hydra/config.yaml`` holds every
option that built the model. Options given as ``attention.<option>`` apply to the locations
that run the global choice.

:class:`AttentionPlan` turns the composed ``attention`` node into ``{location: (scheme,
options)}`` once per job; the model, the run-directory tag, W&B tags, summary.json and the
report read it. Why not one group per location: the three locations would need three copies
of every scheme YAML. Why not a plan read from disk by name: command-line options and user
config folders would not reach a scheme named only at one location.
"""
from __future__ import annotations

from types import MappingProxyType
import re
from dataclasses import dataclass
from typing import Any

from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from nas_cli.attention import AttentionCore, SchemeError
from nas_cli.model.layer_plan import Layered, describe, layered
from nas_cli.model.locations import LOCATIONS, PLAIN, hydra_choices, job_locations, name_from_choices

#: keys of a composed ``attention`` node that are not constructor options
_NOT_OPTIONS = frozenset({"name", "per_layer", *LOCATIONS})
#: the settings of today's models around a scheme (nas_cli/attention/mods.py; the recurrent mixers' convolution and
#: gate) at the value that means "none": a scheme's YAML that offers them and leaves them so builds, names and
#: hashes as one without them, and a user's class put in that YAML's place (attention._target_=...) is not handed them
_ABSENT = MappingProxyType({"softcap": None, "window": None, "sink": None, "conv": None, "gate": False,
                           "state": None})


def _options(node: dict) -> dict[str, Any]:
    return {k: v for k, v in node.items()
            if k not in _NOT_OPTIONS and not (k in _ABSENT and v is _ABSENT[k])}
_SHORT = MappingProxyType({"encoder": "enc", "decoder": "dec", "cross": "cross"})


@dataclass(frozen=True)
class Placed:
    """One location's scheme: its name and the keyword arguments of its core (``_target_`` included)."""

    scheme: str
    options: dict[str, Any]
    #: a per-layer pattern (``attention.per_layer``, nas_cli/model/layer_plan.py), or None: every layer the same
    layers: Layered | None = None

    @property
    def core_class(self) -> type[AttentionCore]:
        return get_class(str(self.options["_target_"]))

    def at(self, layer: int) -> "Placed":
        """The scheme and options of one layer."""
        return self if self.layers is None else Placed(*self.layers.at(layer))

    def each(self) -> list["Placed"]:
        """Every distinct entry of the location (the location itself without a per-layer pattern)."""
        return [self] if self.layers is None else [Placed(*e) for e in self.layers.entries]

    @property
    def label(self) -> str:
        """What run names, tags and nas-report call it: the scheme (``unas``), with its window (``unas@w64``), or
        its per-layer pattern (``unas@w64*5+unas``)."""
        return describe(self.scheme, self.options) if self.layers is None else self.layers.label

    def identity(self) -> dict[str, Any]:
        own = {"scheme": self.scheme, **self.options}
        if self.layers is not None:
            own["per_layer"] = [{"scheme": s, **o} for s, o in self.layers.entries]
        return own


class AttentionPlan:
    """``{location: Placed}`` for the locations the model has: the three of an encoder-decoder,
    ``decoder`` alone for a language model. A run's label, tags and ``config_id`` come from this
    and nothing else, so two spellings that build the same model are one setup."""

    def __init__(self, placed: dict[str, Placed], explicit: frozenset[str] = frozenset()):
        self.placed = placed
        #: locations the config names itself (``attention.cross=dnas``), not by the global choice
        self.explicit = explicit
        #: {location: scheme name} (a per-layer pattern's: the location's own scheme)
        self.names: dict[str, str] = {loc: p.scheme for loc, p in placed.items()}
        #: {location: label}: the scheme, its window, or its per-layer pattern (:attr:`Placed.label`)
        self.labels: dict[str, str] = {loc: p.label for loc, p in placed.items()}
        #: every scheme some layer runs (what a Hugging Face model registers)
        self.schemes: tuple[str, ...] = tuple(sorted({e.scheme for p in placed.values() for e in p.each()}))
        #: 'dnas' when one scheme runs everywhere, else 'enc-hnas_dec-unas_cross-unas'
        self.tag: str = tag_from_names(self.labels)
        #: one W&B tag per location: 'encoder:dnas', ...
        self.wandb_tags: list[str] = [f"{loc}:{name}" for loc, name in self.labels.items()]

    @classmethod
    def from_config(cls, attn_cfg: DictConfig | dict) -> "AttentionPlan":
        """From a composed ``attention`` node (or one scheme's YAML: that scheme everywhere).

        A location is either absent (the global choice) or a node with its own ``_target_``
        (and ``name``: see :func:`name_from_choices`) composed by Hydra."""
        placed, own, explicit = _placements(attn_cfg)
        for loc, p in placed.items():
            where = "attention" if loc not in explicit else f"attention.{loc}"
            for i, entry in enumerate(p.each()):
                _check_declared(entry, where if p.layers is None else f"{where}.per_layer[{i}]")
        return cls(placed, explicit)

    @classmethod
    def for_job(cls, cfg: DictConfig | dict) -> "AttentionPlan":
        """The plan of a whole composed config, resolved against the model it builds
        (:meth:`restricted` to :func:`~nas_cli.model.locations.job_locations`)."""
        used = job_locations(cfg)
        return cls.from_config(cfg["attention"]).restricted(used, _model_words(cfg, used))

    def restricted(self, used: tuple[str, ...], model: str = "the model") -> "AttentionPlan":
        """The plan of the locations ``used`` (what the model builds). A location the config names
        but the model does not have is refused in one line: a run labelled with a scheme it never
        ran would be compared as if it had."""
        for loc in LOCATIONS:
            if loc in self.explicit and loc not in used:
                keep = ", ".join(f"attention.{u}=..." for u in used)
                raise SchemeError(f"attention.{loc}={self.placed[loc].scheme}: {model} has no {PLAIN[loc]}; "
                                  f"drop attention.{loc} (the locations it has: {keep}, or attention=... for all)")
        return AttentionPlan({loc: self.placed[loc] for loc in LOCATIONS if loc in used},
                             self.explicit & frozenset(used))

    def identity(self) -> dict[str, dict[str, Any]]:
        """``{location: {"scheme": name, **options}}``: what ``config_id`` hashes in place of the
        composed ``attention`` node (see :func:`canonical_config`)."""
        return {loc: p.identity() for loc, p in self.placed.items()}

    # --- building the cores -----------------------------------------------------------
    def core(self, location: str, layer: int, causal: bool, heads: int, dropout: float = 0.0) -> AttentionCore:
        """The core of one layer. ``causal`` is the key mask of self-attention; decoder self-
        and cross-attention are built with ``prefix_queries=True``, so no scheme can aggregate
        over future target queries (Ding et al.'s column step, Sinkhorn iterations)."""
        placed = self.placed[location].at(layer)
        try:
            return instantiate(placed.options, heads=heads, causal=causal, dropout=dropout, name=placed.scheme,
                               prefix_queries=causal or location in ("decoder", "cross"), location=location,
                               layer=layer)
        except Exception as err:  # noqa: BLE001 - Hydra wraps it: the core's own refusal says what to write
            if isinstance(err.__cause__, SchemeError):
                raise SchemeError(str(err.__cause__)) from None
            raise

    def core_factory(self, heads: int, dropout: float = 0.0) -> "Cores":
        """core_factory(location, layer, causal) -> AttentionCore, as the model takes it."""
        return Cores(self, heads, dropout)

    def model_cores(self, model_cfg: DictConfig) -> "Cores":
        """The cores of the model ``model_cfg`` describes (its heads and attention dropout)."""
        return self.core_factory(int(model_cfg.heads), float(model_cfg.get("attention_dropout", 0.0)))

    # --- cross-group constraints, checked before any data or W&B run -----------------
    def check(self, model_cfg: DictConfig) -> None:
        """One line naming the option to change when a scheme cannot run with this model.

        Builds one probe core per location (cheap: no width-dependent parameters yet), so
        flags that follow a scheme's options (``attention.positions``) are the ones the
        model will see."""
        positions = str(model_cfg.get("positions", "sinusoidal"))
        for loc, layer in ((loc, i) for loc, p in self.placed.items() for i in range(len(p.each()))):
            causal = loc == "decoder"
            try:
                core = self.core(loc, layer, causal, int(model_cfg.heads))
            except SchemeError:
                raise
            except Exception as err:  # noqa: BLE001 - a bad option value: name the location
                msg = str(err.__cause__ or err).strip().splitlines()[-1]
                raise SchemeError(f"attention at {loc} ({self.placed[loc].scheme}): {msg}") from None
            if positions == "alibi" and causal and not core.takes_alibi:
                where = "attention" if loc not in self.explicit else f"attention.{loc}"
                raise SchemeError(f"{where}={self.placed[loc].scheme} takes no score bias, so model.positions=alibi "
                                  "cannot reach it: use model.positions=rope, sinusoidal or none with it, or alibi with "
                                  f"{', '.join(alibi_schemes())}")
            if core.requires_no_input_positions and positions != "none":
                where = "attention" if loc not in self.explicit else f"attention.{loc}"
                raise SchemeError(
                    f"{where}={self.placed[loc].scheme} puts positions into the attention itself, but model.positions="
                    f"{positions} adds them to the input too: add model.positions=none")

    def to_dict(self) -> dict[str, Any]:
        return {loc: {"scheme": p.scheme, "options": p.options} for loc, p in self.placed.items()}


class Cores:
    """The cores of one model: ``cores(location, layer, causal) -> AttentionCore`` with the plan's
    heads and dropout bound, and the plan's scheme ``names`` (what a Hugging Face model registers)."""

    def __init__(self, plan: AttentionPlan, heads: int, dropout: float = 0.0):
        self.plan, self.heads, self.dropout = plan, heads, dropout
        self.names = plan.names

    def __call__(self, location: str, layer: int, causal: bool) -> AttentionCore:
        return self.plan.core(location, layer, causal, self.heads, self.dropout)


def _placements(attn_cfg: DictConfig | dict) -> tuple[dict[str, Placed], dict[str, Any], frozenset[str]]:
    """{location: Placed} of a composed ``attention`` node, the global node's options, and the
    locations the node names itself (see :meth:`AttentionPlan.from_config`); the options are not
    checked here."""
    node = OmegaConf.create(attn_cfg) if isinstance(attn_cfg, dict) else attn_cfg
    data = OmegaConf.to_container(node, resolve=True)
    if "_target_" not in data:
        raise SchemeError("the attention config has no _target_; choose a scheme with attention=<name>")
    name = str(data.get("name") or data["_target_"].rsplit(".", 1)[-1].lower())
    own = _options(data)
    layers = _layered(data.get("per_layer"), name, own, "attention")
    placed = {}
    explicit = frozenset(loc for loc in LOCATIONS if data.get(loc) is not None)
    for loc in LOCATIONS:
        value = data.get(loc)
        if value is None or value == name:
            placed[loc] = Placed(name, own, layers)
        elif isinstance(value, dict):
            if "_target_" not in value:
                raise SchemeError(f"attention.{loc} has options but no scheme: choose one with "
                                  f"attention.{loc}=<scheme> before setting attention.{loc}.<option>")
            scheme, options = str(value.get("name", loc)), _options(value)
            placed[loc] = Placed(scheme, options, _layered(value.get("per_layer"), scheme, options, f"attention.{loc}"))
        else:  # Hydra composes a location's scheme as its node; a bare name is not one
            raise SchemeError(f"attention.{loc}: expected a scheme's node (attention.{loc}=<scheme> on the command "
                              f"line composes it), got the value {value!r}")
    return placed, own, explicit


def _layered(value, scheme: str, options: dict[str, Any], where: str) -> Layered | None:
    try:
        return layered(value, scheme, options, where, _options)
    except ValueError as err:
        raise SchemeError(str(err)) from None


def _model_words(cfg: DictConfig | dict, used: tuple[str, ...]) -> str:
    """How a refusal names the model a config builds (``used``: the locations it has)."""
    task = cfg["task"].get("name", "?") if "task" in cfg else "?"
    if used == ("decoder",):
        return f"task {task} builds a decoder-only model: it"
    if "encoder" not in used:
        return "model.encoder_layers=0 builds no encoder: the model"
    return "the model"


def canonical_config(config: dict) -> dict:
    """``config`` (a resolved container) with its ``attention`` node replaced by the plan of the
    locations the model has (:meth:`AttentionPlan.identity`): ``attention=dnas`` and
    ``attention.decoder=dnas`` on a language model are one setup. Unchanged when it has no
    attention a plan can be read from."""
    if not isinstance(config.get("attention"), dict) or "task" not in config:
        return config
    try:
        placed = _placements(config["attention"])[0]
    except SchemeError:
        return config
    return {**config, "attention": {loc: placed[loc].identity() for loc in LOCATIONS if loc in job_locations(config)}}


#: constructor parameters nas-run sets itself for every core: never options of a scheme's YAML
INJECTED = MappingProxyType({"heads": "model.heads", "dropout": "model.attention_dropout", "causal": "the location",
            "prefix_queries": "the location", "location": "the location", "layer": "the layer"})


def _check_declared(placed: Placed, where: str) -> None:
    """Every option of a placed scheme is a parameter of its core's constructor (nas_cli/infra/options.py):
    one line with the closest name otherwise, before anything is made."""
    from nas_cli.infra.options import (declared, declared_types, example_value, type_problem,
                                      unknown_option_message)

    try:
        names, hints = declared(placed.core_class), declared_types(placed.core_class)
    except (ImportError, AttributeError, ValueError) as err:
        raise SchemeError(f"{where}._target_={placed.options.get('_target_')} cannot be imported ({err})") from None
    for key, value in placed.options.items():
        if key in INJECTED:
            raise SchemeError(f"{where}.{key}={value}: set by nas-run from {INJECTED[key]} for every core, not a "
                              f"scheme option; set {INJECTED[key]} instead" if "." in INJECTED[key]
                              else f"{where}.{key}={value}: set by nas-run from {INJECTED[key]}, not an option")
        if names is not None and key != "_target_" and key not in names:
            owners = option_owners(key, placed.scheme)
            if owners:
                raise SchemeError(f"{where}.{key}={value}: {placed.scheme} has no option '{key}'{owners}")
            raise SchemeError(unknown_option_message(where, key, value, placed.scheme,
                                                     names - set(INJECTED) - {"name"}))
        wanted = type_problem(value, hints[key]) if key in hints else None
        if wanted:  # the type is the constructor's annotation: nothing else declares it
            raise SchemeError(f"{where}.{key}={value}: {placed.scheme}'s option '{key}' takes {wanted} (e.g. "
                              f"{where}.{key}={example_value(hints[key])})")


def make_core_factory(attn_cfg: DictConfig | dict, heads: int, dropout: float = 0.0):
    """core_factory(location, layer, causal) for ``attn_cfg`` (a composed ``attention`` node or
    one scheme's YAML): shorthand for ``AttentionPlan.from_config(attn_cfg).core_factory``."""
    return AttentionPlan.from_config(attn_cfg).core_factory(heads, dropout)


def tag_from_names(names: dict[str, str]) -> str:
    """{location: scheme} of the locations a model has -> 'dnas' when one scheme runs at all of
    them, else per location ('enc-hnas_dec-unas_cross-unas')."""
    if len(set(names.values())) == 1:
        return next(iter(names.values()))
    return "_".join(f"{_SHORT[loc]}-{names[loc]}" for loc in LOCATIONS if loc in names)


def tag_resolver(attn_node, task_target, model_node) -> str:
    """``${nas.tag:${attention},${task._target_},${model}}``: the scheme tag in run-directory names,
    of the locations the model has. Hydra resolves it before nas-run's pre-run check: the options
    are checked there (one line), not here (a traceback)."""
    from nas_cli.model.locations import used_locations

    used = used_locations(task_target, model_node)
    attn_node = OmegaConf.to_container(attn_node, resolve=True) if isinstance(attn_node, DictConfig) else attn_node
    if isinstance(attn_node, dict):  # a copy: the name a sweep job's directory needs before the job names its config
        name_from_choices({"attention": attn_node}, hydra_choices())
    try:
        placed = _placements(attn_node)[0]
    except SchemeError:  # the pre-run check says what is wrong, in one line; the name only needs a tag
        return "invalid"
    return tag_from_names({loc: p.label for loc, p in placed.items() if loc in used})


_ALIAS = re.compile(r"^(attention)\.(encoder|decoder|cross)=(.*)$")


def location_alias(args: list[str]) -> list[str]:
    """``attention.decoder=unas`` -> ``attention@attention.decoder=unas`` (the Hydra package
    override that composes the scheme's YAML at that location). Anything else is unchanged,
    options of a location included (``attention.decoder.dropout=0.1``)."""
    return [_ALIAS.sub(r"\1@\1.\2=\3", a) for a in args]


def schemes_with_option(key: str) -> list[str]:
    """The packaged schemes that have the option ``key`` (in their YAML or their core's constructor):
    what a refusal names when the chosen scheme lacks it (``attention.impl`` is DNAS's, HNAS's and
    Sinkhorn's, not UNAS's)."""
    from nas_cli.infra.options import declared
    from nas_cli.model.choices import available, scheme_config

    if key in INJECTED or key in ("name", "_target_"):
        return []
    found = []
    for name in available("attention"):
        cfg = scheme_config(name)
        try:
            names = declared(get_class(str(cfg._target_))) or set()
        except Exception:  # noqa: BLE001 - a scheme that does not import names nothing
            names = set()
        if key in cfg or key in names:
            found.append(name)
    return found


def option_owners(key: str, chosen: str) -> str:
    """``"; it is an option of dnas, hnas, sinkhorn (attention=<one of them>)"`` when other schemes than
    ``chosen`` have ``key``, else ""."""
    owners = [s for s in schemes_with_option(key) if s != chosen]
    if not owners:
        return ""
    shown = ", ".join(owners[:8]) + (", ..." if len(owners) > 8 else "")
    return f"; it is an option of {shown} (attention=<one of them>)"


def alibi_schemes() -> list[str]:
    """The packaged schemes whose cores take ALiBi's bias (``AttentionCore.takes_alibi``), for messages."""
    from nas_cli.model.choices import available, scheme_config

    found = []
    for name in available("attention"):
        try:
            if getattr(get_class(str(scheme_config(name)._target_)), "takes_alibi", False):
                found.append(name)
        except Exception:  # noqa: BLE001 - a scheme that does not import names nothing
            continue
    return found
