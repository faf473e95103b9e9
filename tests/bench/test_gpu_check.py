"""The parts a CPU can check: ``nas-bench gpu-check`` (numerics of every scheme against
a float64 reference, also under half-precision autocast) and its behaviour without CUDA."""
import shutil
import sys
from pathlib import Path

import pytest
import torch

from nas_cli.bench import gpucheck
from helpers import run_command

NAS_BENCH = shutil.which("nas-bench") or str(Path(sys.executable).parent / "nas-bench")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run")
def test_gpu_check_without_cuda_is_one_line_and_a_non_zero_exit():
    proc = run_command([NAS_BENCH, "gpu-check"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.strip().count("\n") == 0
    assert "no CUDA device on this machine; nothing was run" in proc.stderr


def test_every_scheme_matches_float64_in_float32_on_the_cpu():
    # the Triton kernels' rows are left to tests/attention/test_attention_triton.py, which checks the
    # same cores against float64 in more cases: here, under the interpreter, their prefix scans alone
    # took 56 of this test's 57 s (one Python call per tile element)
    names = [n for n in gpucheck.scheme_names() if not n.endswith("-triton")]
    assert len(names) < len(gpucheck.scheme_names())
    rows = gpucheck.check_numerics("cpu", ["float32"], schemes=names, s=24, d=16)
    assert {r["scheme"] for r in rows} == set(names)
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad[:3]
    assert max(r["err_out"] for r in rows) < 1e-4


def test_doubly_normalized_schemes_stay_finite_under_fp16_autocast():
    """Under fp16 autocast the prefix (causal) and cross forms of DNAS, HNAS and Sinkhorn normalize
    their scores in float32: normalizers computed in fp16 give NaN gradients."""
    rows = gpucheck.check_numerics("cpu", ["fp16", "bf16"], schemes=["dnas", "hnas", "sinkhorn"], s=24, d=16)
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad[:3]


def test_gpu_check_cli_on_the_cpu_prints_a_table_and_fails_on_a_failure(tmp_path):
    ok = run_command([NAS_BENCH, "gpu-check", "--device", "cpu", "--skip-training", "--schemes", "unas,dnas",
                         "--dtypes", "float32", "--out-json", str(tmp_path / "g.json")],
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "10 of 10 checks passed" in ok.stdout and (tmp_path / "g.json").is_file()  # 2 schemes x 5 forms
    bad = run_command([NAS_BENCH, "gpu-check", "--device", "cpu", "--dtypes", "float8"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "--dtypes float8" in bad.stderr


def test_training_rows_name_the_error_not_hydras_hint_and_cover_the_fused_paths(tmp_path):
    """A training case that fails shows the error above Hydra's 'Set the environment variable
    HYDRA_FULL_ERROR=1 ...' hint, not the hint as its only reason."""
    stderr = ("Error executing job with overrides: ['attention=dnas']\nTraceback (most recent call last):\n"
              "AttributeError: 'Placed' object has no attribute 'name'\n\n"
              "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n")
    assert gpucheck._last_error_line(stderr) == "AttributeError: 'Placed' object has no attribute 'name'"
    names = [name for name, _ in gpucheck.train_cases("cuda", gpucheck._write_data(tmp_path))]
    assert "translation, DNAS impl=flex, bf16-mixed" in names and "translation, DNAS impl=triton, bf16-mixed" in names


def test_gpu_check_flags_a_scheme_that_computes_in_another_half_precision(monkeypatch):
    # a core that answers in float16 under bf16 autocast has errors that pass bf16's tolerance (fp16 is the
    # more precise), so the check also compares the output's dtype with the autocast dtype. A core made to
    # answer in float16 under bf16 autocast is flagged; the real one is not.
    from dataclasses import replace

    real = gpucheck.make_core

    class Float16Out(torch.nn.Module):
        def __init__(self, core):
            super().__init__()
            self.core = core

        def forward(self, q, k, v, **kw):
            res = self.core(q, k, v, **kw)
            return replace(res, out=res.out.half()) if torch.is_autocast_enabled("cpu") else res

    ok = gpucheck.check_numerics("cpu", ["bf16"], ["dnas"], s=16, d=8)
    assert ok and all(r["ok"] for r in ok), ok
    monkeypatch.setattr(gpucheck, "make_core", lambda *a, **kw: Float16Out(real(*a, **kw)))
    bad = gpucheck.check_numerics("cpu", ["bf16"], ["dnas"], s=16, d=8)
    assert bad and all(r["problem"] == "computes in torch.float16 under bf16 autocast" for r in bad), bad
