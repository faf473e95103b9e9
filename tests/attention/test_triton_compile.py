"""The Triton kernels compile for an NVIDIA Hopper GPU (sm_90: H100/H200) on this CPU-only
machine, and their bf16 products run on the tensor cores.

The interpreter tests (test_attention_triton.py) check the kernels' arithmetic, not that compiled Triton
accepts them: a helper with two returns of different dtypes ran under the interpreter and failed every
bf16/fp16 kernel's compilation for CUDA. ``benchmarks/triton_compile.py`` compiles each kernel for the
GPU (Triton ships ptxas and cuobjdump) with a driver that launches nothing, and reads the machine code."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import load_benchmark

triton = pytest.importorskip("triton", reason="pip install triton (the [test] extra has it)")

ROOT = Path(__file__).resolve().parents[2]
TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
#: one form per kernel module, with HNAS's extra terms: together they launch every kernel
FORMS = "hnas-encoder,sinkhorn3-encoder,hnas-prefix"


def _kernels() -> set[str]:
    """Every kernel the modules define (a jit function whose name ends in _kernel), as module.name."""
    found = set()
    for path in (ROOT / "nas_cli" / "attention").glob("triton_*_kernels.py"):
        module = path.stem.removeprefix("triton_").removesuffix("_kernels")
        found |= {f"{module}.{node.name}" for node in ast.parse(path.read_text()).body
                  if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel")}
    return found


@pytest.mark.skipif(not (TOOLS / "ptxas").exists() or not (TOOLS / "cuobjdump").exists(),
                    reason="this Triton has no bundled ptxas/cuobjdump")
def test_every_kernel_compiles_for_hopper_and_its_bf16_products_use_the_tensor_cores(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")  # compile here, not from an earlier run's cache
    rows = []
    # at a length every tile divides (the encoder kernels' EVEN case), then the encoder kernels again at one
    # that the tiles do not divide (with their bounds test, as padded training batches of any length run them;
    # Sinkhorn-k's kernels take the same bounds test from the same helper)
    for seq, forms in (("1024", FORMS), ("1000", "hnas-encoder")):
        out = tmp_path / f"compiled_{seq}.json"
        run = subprocess.run([sys.executable, "benchmarks/triton_compile.py", "--quick", "--forms", forms, "--dtypes",
                              "bfloat16", "--d-heads", "64", "--seq", seq, "--jobs", "2", "--out-json", str(out)],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        rows += json.loads(out.read_text())
    assert {r["kernel"] for r in rows} == _kernels()
    assert {r["kernel"] for r in rows if r["seq"] == 1000} == {k for k in _kernels() if k.startswith("encoder.")}
    assert all(r["ok"] and r["arch"] == "sm_90" for r in rows)
    # every kernel multiplies bf16 tiles: on the tensor cores (HMMA/HGMMA), never emulated on the FMA units
    assert all(r["tensor_core_instr"] > 0 for r in rows), [r["kernel"] for r in rows if not r["tensor_core_instr"]]
    # the prefix form's logarithms of a bf16 input on the special-function unit (fast_log), not libdevice's
    # float32-exact polynomial (about twenty instructions each)
    fast = [r for r in rows if r["kernel"] in ("prefix.row_kernel", "prefix.bwd_col_kernel", "prefix.col_carry_kernel")]
    assert fast and all(r["mufu_lg2"] > 0 for r in fast), [(r["kernel"], r["mufu_lg2"]) for r in fast]
    # 64-bit offsets: a tensor (or the prefix form's carries) may pass 2^31 elements without wrapping
    assert all(r["offsets_int64"] for r in rows), [r["kernel"] for r in rows if not r["offsets_int64"]]
    # a Hopper program has 255 registers per thread and 227 KiB of shared memory
    assert all(0 < r["regs"] <= 255 and r["shared_bytes"] <= 227 * 1024 for r in rows)


def test_the_compiled_kernels_page_regenerates_from_its_committed_rows():
    """docs/triton_compile.md is the tool's table of docs/triton_compile.json (the run it names)."""
    markdown = load_benchmark("triton_compile").markdown

    assert os.environ.get("TRITON_INTERPRET") == "1"  # importing the tool left the interpreter on
    rows = json.loads((ROOT / "docs" / "triton_compile.json").read_text())
    command = ("python benchmarks/triton_compile.py --d-heads 64,128 --out-json docs/triton_compile.json "
               "--out-md docs/triton_compile.md")
    assert (ROOT / "docs" / "triton_compile.md").read_text() == markdown(rows, command)
    assert rows and all(r["ok"] for r in rows) and {r["arch"] for r in rows} == {"sm_90"}
