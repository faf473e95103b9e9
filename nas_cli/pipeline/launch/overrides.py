"""Typos on the command line, caught before Hydra: one line with the closest valid name.

Hydra answers ``model.head=4`` or ``atention=dnas`` with a six-line message and exit code 1,
and suggests ``+model.head=4``, which then trains with the key silently ignored.
:func:`check_overrides` composes the configuration the command selects (group choices first,
a sweep's first value standing for the sweep) and refuses, with exit code 2 and a "did you
mean" line: an unknown config group or key, and an unknown choice of a group (every value of
a sweep). ``+key=value`` adds a key on purpose and is left to Hydra, except in the sections
nas-run reads key by key (``model``, ``optim``, ``checkpoint``, ``diagnostics``), where an added
key would be silently ignored: it is refused. ``~key`` and ``hydra.*`` overrides are left to Hydra.
A user's own config folders (``hydra.searchpath=[file://my_conf]``) are checked the same way: their
groups and choices count as the package's.
"""
from __future__ import annotations

import difflib
from functools import lru_cache
from pathlib import Path

from nas_cli.errors import UserError
from nas_cli.pipeline.launch.hydra_groups import check_hydra_groups
from nas_cli.model.plan import LOCATIONS


def _close(word: str, choices) -> str:
    found = difflib.get_close_matches(word, sorted(set(choices)), n=1, cutoff=0.6)
    return f"; did you mean {found[0]}?" if found else ""


#: sections whose keys nas-run reads one by one: a key added there would be ignored
CLOSED_SECTIONS = ("model", "optim", "checkpoint", "diagnostics")


def _values(override) -> list[str]:
    """The values an override (or each value of a sweep) stands for, as override text."""
    if override.is_sweep_override():
        try:
            return list(override.sweep_string_iterator())
        except Exception:  # noqa: BLE001 - range/interval sweeps: nothing to check by name
            return []
    return [override.get_value_element_as_str()]


def _unparsable(parser, overrides: list[str], err: Exception) -> str:
    """One line for an override Hydra's grammar refuses: which one, and, for a value with characters
    outside ASCII or Hydra's special characters, how to quote it."""
    from hydra.errors import HydraException

    for text in overrides:
        try:
            parser.parse_overrides([text])
        except HydraException:
            key, _, value = text.partition("=")
            if value and not (value[0] in "'\"" and value[-1] == value[0]):
                why = ("characters outside ASCII" if not value.isascii() else "characters Hydra's override "
                       "grammar reserves")
                return (f"{text}: the value has {why}; quote it, e.g. '{key}=\"{value}\"' (the single quotes keep "
                        "the double quotes from the shell)")
            return f"{text}: cannot parse this override ({str(err).strip().splitlines()[0]})"
    return f"cannot parse the override(s): {str(err).strip().splitlines()[0]}"


@lru_cache(maxsize=1)
def lightning_arguments() -> tuple[str, ...]:
    """The keyword arguments of Lightning's ``Trainer``, as its signature names them."""
    import inspect

    import pytorch_lightning as pl

    return tuple(name for name in inspect.signature(pl.Trainer.__init__).parameters if name != "self")


def _trainer_argument(o, key: str) -> bool:
    """Whether ``trainer.<name>`` is an argument of Lightning's Trainer (nas-run passes every one on, set
    in a preset or not); one line naming Lightning's closest argument when it is not."""
    name = key.split(".", 1)[1] if key.count(".") == 1 else None
    if name is None:
        return False
    known = lightning_arguments()
    if name in known:
        return True
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    nearest = close or difflib.get_close_matches(name, known, n=1, cutoff=0.0) or ["max_steps"]
    hint = f"did you mean trainer.{close[0]}?" if close else f"the closest of its arguments is trainer.{nearest[0]}"
    raise UserError(f"{'+' if o.is_add() else ''}{key}: Lightning's Trainer has no argument '{name}'; {hint} "
                    "(all of them: https://lightning.ai/docs/pytorch/stable/common/trainer.html)")


def check_overrides(args: list[str], conf_dir: Path) -> list[str]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    if any(a.startswith(("--config", "-cp", "-cn", "-cd", "resume=")) for a in args):
        return []  # another config source: resume= (check_resume_overrides), --config-path (Hydra checks it)
    searchpath = [a for a in args if a.startswith(("hydra.searchpath=", "+hydra.searchpath="))]
    dirs = [conf_dir, *user_config_dirs(searchpath)]
    check_hydra_groups(args, conf_dir, tuple(dirs[1:]))  # hydra/launcher=..., hydra/sweeper=...
    plain = [a for a in args if a not in ("-m", "--multirun") and "=" in a and not a.startswith(("hydra.", "hydra/"))]
    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(plain)
    except HydraException as err:
        raise UserError(_unparsable(parser, plain, err)) from None
    groups = {p.name for d in dirs for p in d.iterdir() if p.is_dir() and p.name != "hydra"}
    chosen, keys = [], []
    for o, text in zip(parsed, plain):
        key = o.key_or_group
        if o.is_add() and key.startswith("trainer."):
            _trainer_argument(o, key)  # +trainer.<name>: a Lightning argument, or one line
        if o.is_delete() or (o.is_add() and (key.split(".")[0] not in CLOSED_SECTIONS
                                              or key.startswith("diagnostics.metrics."))):  # a new plug-in
            continue
        if o.package and key not in groups:
            continue
        if key in groups:
            chosen += _group_choice(o, key, dirs)
        else:
            keys.append((o, key, text))
    return _check_keys(keys, conf_dir, searchpath, chosen, groups) if keys else []


def _group_choice(o, key: str, dirs: list[Path]) -> list[str]:
    """A config group's value(s) checked against its options (the package's and the user's): one line
    naming the closest where one is not; the first value as the composition's override."""
    options = [p.stem for d in dirs for p in (d / key).glob("*.yaml")]
    values = [v for v in _values(o) if v != "null"]
    shown = o.package if key == "attention" and str(o.package).startswith("attention.") else \
        key + (f"@{o.package}" if o.package else "")  # as typed: attention.decoder=<scheme>
    for value in values:
        if value not in options:
            raise UserError(f"{shown}={value}: no such choice{_close(value, options)} (choices: "
                            f"{', '.join(sorted(options))})")
    return [f"{key}{'@' + o.package if o.package else ''}={values[0]}"] if values else []


def _check_keys(keys: list, conf_dir: Path, searchpath: list[str], chosen: list[str], groups: set[str]) -> list[str]:
    """Each key=value override checked against the config composed with the chosen groups: one line for
    an unknown key; returns the trainer.<Lightning argument> overrides that no preset sets (Hydra needs
    them written +trainer.<name>=)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        cfg = compose("config", overrides=[*(a.lstrip("+") for a in searchpath), *chosen])
    added = []
    for o, key, text in keys:
        if OmegaConf.select(cfg, key, default=_MISSING, throw_on_resolution_failure=False) is _MISSING:
            if key.startswith("trainer.") and _trainer_argument(o, key):
                added.append(text)
                continue
            _unknown_key(cfg, o, key, groups)
    return added


def check_resume_overrides(run_dir: Path, args: list[str], conf_dir: Path) -> list[str]:
    """``nas-run resume=<dir> [overrides]``: the overrides apply to the run's saved config
    (``.hydra/config.yaml``), which has no config groups left to choose. Hydra answered a group choice
    (``debug=fast``, ``attention=dnas``, ``trainer=gpu``) with a six-line message or a ValueError, and a
    misspelled key the same way; ``+debug=fast`` trained with it silently ignored. Refused here, one line
    each: a group choice, a key the saved config lacks, a key added where nas-run would ignore it, and a
    sweep (resume= continues one run). ``hydra.*`` overrides are left to Hydra."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    plain = [a for a in args if "=" in a and not a.lstrip("+~").startswith(("hydra.", "hydra/"))]
    if not plain:
        return []
    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(plain)
    except HydraException as err:
        raise UserError(_unparsable(parser, plain, err)) from None
    groups = {p.name for p in conf_dir.iterdir() if p.is_dir() and p.name != "hydra"}
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    added = []  # trainer.<Lightning argument> the saved config lacks: Hydra needs it written +trainer.<name>=
    for o, text in zip(parsed, plain):
        key = o.key_or_group
        if o.is_sweep_override():
            raise UserError(f"resume={run_dir}: {text} is a sweep; resume= continues one run with one value per key")
        if o.package or key in groups:
            if key == "attention" and str(o.package).startswith("attention."):  # as typed: attention.decoder=dnas
                text = f"{o.package}={text.partition('=')[2]}"
            raise UserError(f"resume={run_dir}: {text} chooses a config, which a resumed run keeps from its saved "
                            f".hydra/config.yaml; change single keys (e.g. trainer.max_steps=...), or start a new run "
                            f"with {text}")
        top = key.split(".")[0]
        if o.is_add() and key.startswith("trainer."):
            _trainer_argument(o, key)
        if o.is_delete() or (o.is_add() and top in cfg and (top not in CLOSED_SECTIONS
                                                            or key.startswith("diagnostics.metrics."))):
            continue  # a Trainer or logger option, or a diagnostic plug-in, added on purpose as in a new run
        if OmegaConf.select(cfg, key, default=_MISSING, throw_on_resolution_failure=False) is _MISSING:
            if not o.is_add() and key.startswith("trainer.") and _trainer_argument(o, key):
                added.append(text)
                continue
            _unknown_key(cfg, o, key, groups)
    return added


def _unknown_key(cfg, o, key: str, groups: set[str]) -> None:
    """Refuse a key the composed config lacks, with the closest one (or the section it needs)."""
    from omegaconf import OmegaConf

    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
    if parent and node is None:
        top = parent.split(".")[0]
        loc = parent.split(".")
        if len(loc) == 2 and loc[0] == "attention" and loc[1] in LOCATIONS:
            raise UserError(f"{key}: attention.{loc[1]} runs the scheme chosen with attention=...; to give it "
                            f"options of its own, choose its scheme first: attention.{loc[1]}=<scheme> {key}=...")
        if top in cfg:
            raise UserError(f"{key}: '{parent}' is not a section of the config (see nas-run --cfg job)")
        raise UserError(f"{key}: there is no '{top}' section{_close(top, [*cfg.keys(), *groups])} "
                        f"(sections: {', '.join(sorted(str(k) for k in cfg.keys()))})")
    names = [str(k) for k in node.keys()] if hasattr(node, "keys") else []
    if parent == "attention" or (parent.startswith("attention.") and parent.split(".")[1] in LOCATIONS):
        from nas_cli.model.plan import option_owners

        owners = option_owners(leaf, str(node.get("name", "")))
        if owners and leaf not in names:
            raise UserError(f"{key}: {node.get('name', 'the chosen scheme')} has no option '{leaf}'{owners}")
    if parent == "attention":  # the per-location choices (attention.decoder=<scheme>) are not keys until chosen
        names += list(LOCATIONS)
    found = difflib.get_close_matches(leaf, sorted(set(names + ([] if parent else list(groups)))), n=1, cutoff=0.6)
    hint = f"; did you mean {f'{parent}.' if parent else ''}{found[0]}?" if found else ""
    if o.is_add():
        raise UserError(f"+{key}: nas-run does not read this key, so it would be ignored{hint}")
    top = key.split(".")[0]
    open_section = top in cfg and (top not in CLOSED_SECTIONS or key.startswith("diagnostics.metrics."))
    if open_section:  # (a closed section's added key is refused in turn: never advised)
        raise UserError(f"{key} is not an option{hint} (to add a new key on purpose, write +{key}=...)")
    raise UserError(f"{key} is not an option{hint}")


_MISSING = object()


def user_config_dirs(searchpath: list[str]) -> list[Path]:
    """The folders of ``hydra.searchpath=[file://my_conf, pkg://my_package.conf, ...]`` that exist
    (a user's own schemes and tasks): their groups and choices are checked like the package's."""
    out = []
    for arg in searchpath:
        value = arg.split("=", 1)[1].strip().strip("[]")
        for item in (v.strip().strip("'\"") for v in value.split(",") if v.strip()):
            if item.startswith("pkg://"):
                import importlib.util

                try:
                    spec = importlib.util.find_spec(item[len("pkg://"):])
                except (ImportError, ValueError):
                    spec = None
                locations = list(spec.submodule_search_locations or []) if spec else []
                out += [Path(x) for x in locations]
            else:
                path = Path(item.removeprefix("file://")).expanduser()
                if path.is_dir():
                    out.append(path)
    return out


def swept_scheme_options(argv: list[str], conf_dir: Path) -> list[str]:
    """``-m attention=deltanet,mamba2 attention.conv=4``: an option beside a sweep over the schemes that offer it.
    Hydra composes a sweep's own config without its sweep overrides, so with the default scheme, which may lack
    the option (Hydra's message of several lines). Each swept scheme must offer it: one line names one that does
    not. It is then passed as ``++attention.<option>=`` (set where the scheme has it, added where not), so the
    sweep's own config composes, and each job's config has it as typed."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    if "-m" not in argv:
        return argv
    parser = OverridesParser.create()
    parsed = {}
    for arg in argv:
        if not arg.startswith("-") and "=" in arg and not arg.lstrip("+~").startswith("hydra"):
            try:
                parsed[arg] = parser.parse_override(arg)
            except Exception:  # noqa: BLE001 - Hydra says what is wrong with it
                continue
    schemes = next(([str(v) for v in o.sweep_string_iterator()] for o in parsed.values()
                    if o.key_or_group == "attention" and not o.package and o.is_sweep_override()), None)
    if not schemes:
        return argv
    out = []
    for arg in argv:
        o = parsed.get(arg)
        key = o.key_or_group if o is not None else ""
        if o is None or o.package or o.is_add() or o.is_delete() or not key.startswith("attention.") \
                or key.count(".") != 1:
            out.append(arg)
            continue
        option = key.split(".")[1]
        files = {s: conf_dir / "attention" / f"{s}.yaml" for s in schemes}
        lacking = [s for s, f in files.items() if f.is_file() and option not in OmegaConf.load(f)]
        if lacking:
            offering = [s for s in schemes if s not in lacking]
            raise UserError(f"{arg}: {lacking[0]} (swept in attention={','.join(schemes)}) has no option '{option}'; "
                            f"sweep the schemes that offer it{' (' + ', '.join(offering) + ')' if offering else ''}, "
                            "or run the others in a sweep of their own")
        out.append(f"++{arg}")
    return out
