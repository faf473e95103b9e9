"""A job's values checked before anything is made:

* ``config``: every option checked against what reads it (``check_config``; each option's type and
  range as :mod:`nas_cli.pipeline.sections` declares it), one line naming the key and the fix;
* ``sizing``: the model's size, counted before any data, and its memory against the machine's.
"""
