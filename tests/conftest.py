import os
from pathlib import Path
from types import MappingProxyType

# Triton's CPU interpreter for the kernels of attention.impl=triton (tests/attention/test_attention_triton.py):
# it must be set before Triton is first imported, which defines its own library functions then
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_DISABLE_GIT", "true")
# The tests use tiny tensors: one intra-op thread is faster than two (and much faster on a
# busy 2-core machine); subprocesses (the nas-run CLI) inherit the setting.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The suite already runs a test process per core (and one more): the sweeps of its tests run their jobs one after
# another (tests/cli/test_parallel_sweep.py removes this to test the default, several at a time).
os.environ.setdefault("NAS_RUN_SWEEP_JOBS", "1")
torch.set_num_threads(1)


def attention_schemes() -> list[str]:
    from nas_cli.model.choices import available

    return available("attention")


@pytest.fixture(params=attention_schemes())
def scheme(request):
    return request.param


# the configs' ${nas.*} resolvers, registered as every entry point does (no import side effect)
from nas_cli.pipeline.launch.resolvers import register_resolvers  # noqa: E402

register_resolvers()


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker more than the CPUs this process may use. A worker often waits (on a SLURM or
    Ray cluster, a command it signals, a stop it times) while the others compute; docs/testing.md has the
    measurement. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still sets the number, as with pytest-xdist alone."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    return len(os.sched_getaffinity(0)) + 1


def pytest_sessionfinish(session, exitstatus):
    import zygote  # tests/zygote.py: the server that forks the tests' nas-run processes, if one started

    zygote.shutdown()


#: module-scoped fixtures that train a sweep (tests/report/): the tests that use one run on one xdist worker
#: (pyproject's --dist loadgroup), so that it is built once per test run, not once per worker
SHARED_SWEEPS = {"compare_sweep", "sweep", "seed_sweep", "report", "readme_sweep"}


#: the test files of the slow kinds, marked ``slow``: ``python -m pytest -n auto -m "not slow"`` is the loop
#: of minutes a developer runs while working, the README's command (and .ci/run) runs them all
#: (docs/testing.md says what each costs)
SLOW = MappingProxyType({
    "test_slurm": "a real SLURM cluster",
    "test_ray": "a real Ray cluster",
    "test_scale": "kill and resume, stop signals, DDP and sweeps of real processes",
    "test_hardening": "killed, stopped and resumed runs",
    "test_runs_intact": "runs killed at every phase",
    "test_stop_in_evaluation": "stops during long evaluations",
    "test_sequential_sweep": "seed=auto sweeps, killed and continued",
    "test_parallel_sweep": "parallel sweeps of real processes",
    "test_triton_compile": "compiling the Triton kernels",
    "test_attention_triton": "the Triton kernels in Triton's interpreter",
    "test_calibration": "calibration simulations",
    "test_readme_compare": "the README's grid and comparison as written",
    "test_extending": "the extension walk-throughs as written",
    "test_packaging": "building and installing the wheel",
    "test_hf_docs": "the Hugging Face page's example as written",
    "test_debug_fast": "debug=fast on every preset",
    "test_study_page": "the study page regenerated from the committed runs",
    "test_eval_speed": "a benchmark script run end to end",
    "test_tuned_sweep": "a tuned sweep trained and continued",
    "test_recipe": "the checks and the call depth counted in real runs: a single run, a resume and a sweep",
    "test_tuning_calibration": "calibration simulations of the tuning protocols",
})
#: fixtures of the slow kinds: the report tests' shared sweeps (trained once per test run) and a fresh
#: torch.compile cache (compiling kernels)
SLOW_FIXTURES = SHARED_SWEEPS | {"fresh_dynamo"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        if SHARED_SWEEPS & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
        if item.module.__name__.rpartition(".")[2] in SLOW or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) \
                or _off_the_matrix_edges(item):
            item.add_marker(pytest.mark.slow)
    # the slow tests first: xdist hands out the tests one at a time in this order (after the groups, the
    # largest first), so a long test never starts while the others are finishing; the quick tests fill the end
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


#: parametrized tests whose quick-loop share is the edges of their matrix (the rest is slow), by the
#: parameters a quick case has: tests/cli/test_config.py keeps every scheme on one seq2seq and one
#: language-model task and every task with UNAS; tests/cli/test_baselines_cli.py trains one of today's
#: baselines (softpick: weights that need not sum to one, and a sink rate)
EDGES = MappingProxyType({
    "test_every_task_and_scheme_composes_and_runs_a_batch":
        lambda p: p.get("task_name") in ("reverse", "copy_lm") or p.get("scheme") == "unas",
    "test_each_scheme_trains_a_language_model_with_its_sink_rate": lambda p: p.get("scheme") == "softpick",
})


def _off_the_matrix_edges(item) -> bool:
    quick = EDGES.get(getattr(item, "originalname", None))
    return quick is not None and not quick(getattr(getattr(item, "callspec", None), "params", {}))
