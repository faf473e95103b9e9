"""The config choices are the config folders: ``conf/attention/*.yaml`` for schemes, ``conf/task/``
for tasks, and so on; this module reads them and keeps no list.

The folder ships inside the installed package as ``nas_cli.conf`` (``pyproject.toml`` maps
the top-level ``conf/`` there), so a wheel or ``pip install .`` finds it wherever it is
installed. Within a ``nas-run`` job Hydra composes from it (plus any ``hydra.searchpath``
folder); the functions here serve the tools that take a scheme by name outside a job
(``nas-bench``, the GPU check, tests).
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from nas_cli.attention import SchemeError

#: the packaged config folder (a real directory: nas-run is never imported from a zip)
CONF_DIR = Path(str(resources.files("nas_cli.conf")))
#: what Hydra's ``config_path`` names: the package, not a path next to the source tree
CONF_PACKAGE = "pkg://nas_cli.conf"


def available(group: str, extra_dirs: tuple[Path, ...] = ()) -> list[str]:
    """The choices of a config group (file stems), in the packaged folder and ``extra_dirs``."""
    return sorted({p.stem for d in (CONF_DIR, *extra_dirs) for p in (Path(d) / group).glob("*.yaml")})


def scheme_config(name: str) -> DictConfig:
    """One scheme's YAML (``_target_``, its options and its ``name``) from the packaged registry."""
    path = CONF_DIR / "attention" / f"{name}.yaml"
    if not path.is_file():
        raise SchemeError(f"unknown attention scheme '{name}'; valid choices: {', '.join(available('attention'))}")
    node = OmegaConf.load(path)
    if not node.get("name"):  # the file's stem, as in a job (model.locations.name_from_choices)
        node.name = name
    return node

