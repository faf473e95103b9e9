"""The models a run trains, built from one attention plan:

* ``plan``: which scheme runs at which location (encoder / decoder self-attention, cross-attention),
  with its options checked against the scheme's constructor (``options``); built once per job;
* ``choices``: the config groups that ship with nas-run (``conf/``) and the schemes they name;
  ``locations``: the names of the attention locations;
* ``transformer``: the encoder-decoder and decoder-only Transformers the plan's cores sit in;
* ``decoding``: greedy and beam search over a trained model.
"""
