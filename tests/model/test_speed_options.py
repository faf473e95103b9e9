"""Speed switches: ``trainer.precision=bf16-mixed`` and ``compile=...`` give the
loss of the float32 eager run at the first step (same seed, dropout off), and a compile
problem stops the run with one line naming ``compile``."""
import csv
import importlib.util
import shutil

import pytest
import torch
from hydra import compose, initialize_config_dir

from nas_cli.errors import UserError
from nas_cli.model.choices import CONF_DIR
from nas_cli.model.plan import AttentionPlan
from nas_cli.pipeline.run import train

# three steps, every step logged; dropout off so the runs are deterministic; no validation (compile=true
# would compile the greedy decoder's graphs too: twice the time, and nothing these tests look at)
BASE = ["debug=fast", "logger=csv", "trainer.max_steps=3", "trainer.log_every_n_steps=1", "run_test=false",
        "model.dropout=0", "diagnostics.plots=never", "trainer.limit_val_batches=0"]


def logged_losses(run_dir, *overrides) -> list[float]:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=BASE + list(overrides))
    summary = train(cfg, AttentionPlan.for_job(cfg), run_dir, group="t")
    rows = list(csv.DictReader(open(run_dir / "csv" / "metrics.csv")))
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert summary["steps"] == 3 and len(losses) == 3
    return losses


@pytest.fixture(scope="module")
def fp32_losses(tmp_path_factory):
    return logged_losses(tmp_path_factory.mktemp("fp32"))


@pytest.fixture
def fresh_dynamo():
    """Compiled-code caches and counters start empty and are dropped afterwards."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()


def test_bf16_mixed_first_loss_close_to_fp32(fp32_losses, tmp_path):
    bf16 = logged_losses(tmp_path, "trainer.precision=bf16-mixed")
    assert bf16[0] != fp32_losses[0]  # autocast really ran the matmuls in bfloat16
    assert bf16[0] == pytest.approx(fp32_losses[0], rel=5e-3)  # measured: 1e-4 relative
    assert all(torch.isfinite(torch.tensor(bf16)))


def test_compile_aot_eager_matches_eager(fp32_losses, tmp_path, fresh_dynamo):
    """torch.compile's graph capture and AOT autograd (no code generation: fast everywhere)."""
    losses = logged_losses(tmp_path, "compile=aot_eager")
    assert fresh_dynamo["stats"]["unique_graphs"] >= 1  # the model really went through torch.compile
    assert losses[0] == pytest.approx(fp32_losses[0], abs=1e-4)


@pytest.mark.slow  # inductor generates and compiles C++ for the training step: ~60 s with a cold cache on 2 busy cores
def test_compile_true_matches_eager(fp32_losses, tmp_path, fresh_dynamo):
    if not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
        pytest.skip("compile=true (inductor) needs a C++ compiler on CPU and none is on PATH")
    losses = logged_losses(tmp_path, "compile=true")
    assert fresh_dynamo["stats"]["unique_graphs"] >= 1
    assert losses[0] == pytest.approx(fp32_losses[0], abs=1e-4)


def test_unknown_compile_backend_is_a_one_line_user_error(tmp_path):
    with pytest.raises(UserError, match=r"^compile=no_such_backend: unknown torch.compile backend; use "
                                        r"compile=true \(inductor\), compile=false, or one of .*inductor"):
        logged_losses(tmp_path, "compile=no_such_backend")


def test_compile_failure_during_training_is_a_one_line_user_error(tmp_path, fresh_dynamo):
    """A registered backend whose compiler is not installed (openxla needs torch_xla) fails
    at the first forward, inside trainer.fit, as compilation does on a platform without
    a working compiler."""
    if importlib.util.find_spec("torch_xla") is not None:
        pytest.skip("torch_xla is installed, so the openxla backend may work here")
    with pytest.raises(UserError) as exc:
        logged_losses(tmp_path, "compile=openxla")
    msg = str(exc.value)
    assert msg.startswith("compile=openxla: torch.compile (openxla) "
                          "failed on this platform (")
    assert "ImportError" in msg and msg.endswith("; run with compile=false") and "\n" not in msg
    assert not (tmp_path / "summary.json").exists()


def test_step_metrics_are_complete_on_every_logging_step(tmp_path):
    """The training step computes and logs NLL, token accuracy, lr and tokens/s only on the
    steps Lightning writes (every trainer.log_every_n_steps): each written row has all of them."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["debug=fast", "logger=csv", "trainer.max_steps=6",
                                           "trainer.log_every_n_steps=2", "run_test=false"])
    summary = train(cfg, AttentionPlan.for_job(cfg), tmp_path, group="t")
    rows = [r for r in csv.DictReader(open(tmp_path / "csv" / "metrics.csv")) if r.get("train/loss")]
    assert [int(r["step"]) for r in rows] == [1, 3, 5]
    for r in rows:
        for key in ("train/nll", "train/token_acc", "lr", "train/tokens_per_s"):
            assert r[key] != "" and float(r[key]) >= 0, (key, r)
        assert 0 <= float(r["train/token_acc"]) <= 1 and float(r["train/nll"]) > 0
    assert summary["tokens_per_s"] > 0 and isinstance(summary["tokens_per_s"], float)


# --------------------------------------------------------------------------- attention.impl=auto


def _core(scheme, location, **overrides):
    from helpers import build_core

    return build_core(scheme, heads=2, causal=location == "decoder", location=location, **overrides)


@pytest.mark.parametrize("scheme,location,length,naive", [
    ("dnas", "encoder", 64, True),  # full column sums, short: the materialized formula is faster
    ("dnas", "encoder", 255, True),
    ("dnas", "encoder", 256, False),  # from AUTO_NAIVE_BELOW on: the memory-efficient path
    ("hnas", "encoder", 128, True),
    ("hnas", "encoder", 512, False),
    ("dnas", "decoder", 64, True),  # prefix DNAS / HNAS: naive (anchored cumsum) is faster while short
    ("dnas", "cross", 128, True),
    ("hnas", "decoder", 64, True),
    ("dnas", "decoder", 256, False),
    ("hnas", "cross", 300, False),
    ("sinkhorn", "decoder", 64, True),  # prefix Sinkhorn-k (k > 1) is faster naive while short
    ("sinkhorn", "decoder", 300, False),
    ("sinkhorn", "encoder", 64, True),
])
def test_impl_auto_picks_by_length_and_form(scheme, location, length, naive):
    from nas_cli.attention.dnas import AUTO_NAIVE_BELOW, path_for

    def uses_naive(core):  # the naive formula: fused (DNAS, HNAS) or materialized (Sinkhorn-k)
        return path_for(core, q, q).name in ("naive", "materialized")

    assert AUTO_NAIVE_BELOW == 256
    core = _core(scheme, location)
    assert core.impl == "auto"  # the default in conf/attention/<scheme>.yaml and of the constructor
    assert type(core)(heads=2).impl == "auto"
    q = torch.zeros(1, 2, length, 8)
    assert uses_naive(core) is naive
    # the explicit choices are never overridden, and block_size (efficient-only) selects efficient
    assert uses_naive(_core(scheme, location, impl="naive")) is True
    assert uses_naive(_core(scheme, location, impl="efficient")) is False
    assert _core(scheme, location, block_size=16).impl == "efficient"


@pytest.mark.parametrize("scheme,location", [("dnas", "encoder"), ("hnas", "decoder"), ("sinkhorn", "cross")])
def test_impl_auto_gives_the_reference_values_and_gradients(scheme, location):
    from helpers import qkv

    q, k, v = qkv(b=2, h=2, sq=9, sk=9 if location != "cross" else 6)
    grads = {}
    for impl in ("auto", "naive", "efficient"):
        core = _core(scheme, location, impl=impl).double()
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        out = core(qq, kk, vv).out
        out.sum().backward()
        grads[impl] = (out.detach(), qq.grad, kk.grad, vv.grad)
    for impl in ("naive", "efficient"):
        for got, want in zip(grads["auto"], grads[impl]):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)


def test_impl_option_names_auto_in_its_error():
    from nas_cli.attention.dnas import DNAS

    with pytest.raises(ValueError, match=r"attention\.impl must be one of efficient, naive, flex, triton \(got 'fast'\), or auto"):
        DNAS(heads=2, impl="fast")
