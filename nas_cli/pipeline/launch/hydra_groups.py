"""Hydra's own config groups on the command line (``hydra/launcher=``, ``hydra/sweeper=``, ...), checked
before Hydra starts: a choice that does not exist is one line naming the choices there are, and, for a
known plug-in that is not installed, the package that brings it (Hydra answers with a 12-line block)."""
from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from nas_cli.errors import UserError

#: Hydra plug-ins nas-run knows of but does not install: group -> choice -> how to get it
PLUGINS = MappingProxyType({
    "hydra/launcher": MappingProxyType({"rq": "pip install hydra-rq-launcher"}),
    "hydra/sweeper": MappingProxyType({"ax": "pip install hydra-ax-sweeper",
                                       "nevergrad": "pip install hydra-nevergrad-sweeper"}),
})


def hydra_group_choices(args: list[str]) -> list[tuple[str, str]]:
    """(group, value) of each ``hydra/<group>=<value>`` argument (``+``/``~`` prefixes, ``@package`` and
    a sweep's list allowed; a deletion has no value to check)."""
    found = []
    for arg in args:
        key, eq, value = arg.partition("=")
        if not eq or not key.lstrip("+").startswith("hydra/") or key.startswith("~"):
            continue
        group = key.lstrip("+").split("@", 1)[0]
        for choice in value.split(","):
            found.append((group, choice.strip().strip("'\"")))
    return found


def check_hydra_groups(args: list[str], conf_dir: Path, extra_dirs: tuple[Path, ...] = ()) -> None:
    """Refuse a ``hydra/<group>`` that Hydra does not have, or a choice of it that is not there."""
    choices = hydra_group_choices(args)
    if not choices:
        return
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import difflib

    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        groups = sorted({f"hydra/{g}" for g in loader.list_groups("hydra")}
                        | {f"hydra/{p.name}" for d in extra_dirs for p in (d / "hydra").glob("*") if p.is_dir()})
        for group, value in choices:
            if group not in groups:
                close = difflib.get_close_matches(group, groups, n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]}?" if close else ""
                raise UserError(f"{group}={value}: {group} is not a config group of Hydra{hint} (groups: "
                                f"{', '.join(groups)})")
            options = sorted({*loader.get_group_options(group),  # Hydra's, its plug-ins' and nas-run's
                              *(p.stem for d in extra_dirs for p in (d / group).glob("*.yaml"))})  # the user's
            if value in options or value == "null":
                continue
            install = PLUGINS.get(group, {}).get(value)
            if install:
                raise UserError(f"{group}={value}: that plug-in is not installed ({install}); installed: "
                                f"{', '.join(options)}")
            close = difflib.get_close_matches(value, options, n=1, cutoff=0.6)
            hint = f"; did you mean {group}={close[0]}?" if close else ""
            raise UserError(f"{group}={value}: no such choice{hint} (choices: {', '.join(options)})")
