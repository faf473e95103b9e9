"""The console scripts, the top floor: one module per command, each parsing its command line,
calling the layer below (``nas_run``: the Hydra application; ``nas_eval``, ``nas_report``,
``nas_repro``, ``nas_bench``) and printing the result. Nothing in the library imports from here.
"""
