"""nas-run configuration: the Hydra config groups, shipped inside the installed package as
``nas_cli.conf`` (see pyproject.toml). Users add their own groups or choices with
``hydra.searchpath=[file://my_conf]``; this folder is not edited for that."""
