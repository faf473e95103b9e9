"""One run, from the command line to its summary, in the order a run goes:

* :mod:`~nas_cli.pipeline.launch`: what ``nas-run`` does around its jobs: the command line before
  Hydra parses it, Hydra's config groups, resolvers and callbacks (the check and lock before Hydra
  writes anything; the sweep's result table), and the sweep's launcher;
* :mod:`~nas_cli.pipeline.checks`: a job's values checked against what reads them, and the model's
  size, before anything is made;
* ``job``: one job (Hydra's task function): its directory, and the one place a failure becomes its
  outcome; ``run``: the job's recipe of named steps (``train``), from the plan to ``summary.json``;
* the steps' parts: ``parts`` (task and module from the config), ``lit`` (the Lightning module),
  ``trainer`` (the Lightning trainer's options), ``progress`` (what a run shows), ``lengths`` (the test
  at other lengths), ``summary`` (what ``summary.json`` records); ``sections``: where each option is
  declared (its type and range), read by the checks and by the steps;
* ``evaluation``: a finished run's checkpoints (averaged or not) scored on a split (``nas-eval``).
"""
