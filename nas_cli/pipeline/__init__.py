"""One run, from the command line to its summary:

* ``overrides``: command-line typos caught before Hydra; ``resolvers``: the config's own
  interpolations (``${nas.tag:...}``);
* ``checks``: every option checked against what reads it, before anything is made;
* ``command_line``: what ``nas-run`` does to its arguments before Hydra parses them (``-m`` anywhere,
  ``seed=auto``, ``resume=``, a continued sweep's order);
* ``callbacks``: Hydra's callbacks (the pre-run check and lock; the sweep's result table);
* ``job``: one job of ``nas-run``: its directory, training, and what a failure leaves behind;
* ``run``: training and testing one configuration (``train``), writing ``summary.json``;
* ``lit``: the Lightning module around the model; ``trainer``: the Lightning trainer's options;
* ``evaluation``: a finished run's checkpoints (averaged or not) scored on a split (``nas-eval``).
"""
