"""The console scripts, the top floor: one module per command, each turning its command line
into calls of the library below (``nas_run``: Hydra application and job; ``nas_eval``,
``nas_report``, ``nas_repro``, ``nas_bench``). Nothing in the library imports from here.
"""
