"""What ``nas-run`` does around its jobs, before and after Hydra runs them:

* ``command_line``: its arguments before Hydra parses them (``-m`` anywhere, ``seed=auto``,
  ``resume=``, a continued sweep's order); ``overrides``: command-line typos, one line each;
* ``hydra_groups``: Hydra's own config groups on the command line; ``resolvers``: the config's own
  interpolations (``${nas.tag:...}``);
* ``callbacks``: Hydra's callbacks: the run or sweep directory's lock and a sweep's checks before Hydra
  writes anything (``RunGuard``), the sweep's result table (``SweepSummary``);
* ``sweep_checks``: a sweep's launcher and ``tune=`` refused before the sweep directory exists;
  ``sweep_launcher``: how many jobs a CPU sweep runs at a time.
"""
