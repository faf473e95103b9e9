"""``nas-bench attention`` at tiny sizes: output files, ratio columns, guards, bad options."""
import json

import pytest
import torch

from nas_cli import bench

SCHEMES = ["unas", "unas-naive", "dnas", "dnas-naive", "hnas", "sinkhorn"]


def run_bench(tmp_path, *extra):
    out_json, out_md = tmp_path / "bench.json", tmp_path / "benchmarks.md"
    argv = ["attention", "--lengths", "32,64", "--heads", "2", "--d-head", "8", "--repeats", "1",
            "--threads", "1", "--out-json", str(out_json), "--out-md", str(out_md), *extra]
    threads = torch.get_num_threads()
    try:
        assert bench.main(argv) == 0
    finally:  # --threads changes the process-wide setting; leave it as it was
        torch.set_num_threads(threads)
    return json.loads(out_json.read_text()), out_md.read_text()


def test_attention_bench_writes_every_scheme_with_ratios(tmp_path):
    md_path = tmp_path / "benchmarks.md"
    md_path.write_text("# Benchmarks\n\n## Training throughput\n\nkept table\n\n"
                       f"{bench.MD_SECTION}\n\nold table to replace\n\n## Later section\n\nalso kept\n")
    data, md = run_bench(tmp_path, "--schemes", ",".join(SCHEMES), "--causal", "both")
    results = data["results"]
    assert len(results) == len(SCHEMES) * 2 * 2  # schemes x lengths x causal settings
    assert {r["scheme"] for r in results} == set(SCHEMES)
    for r in results:
        assert r["status"] == "ok", r
        assert r["time_ms"] > 0 and r["peak_bytes"] > 0
        assert r["time_ratio"] > 0 and r["mem_ratio"] > 0
        if r["scheme"] == "unas":
            assert r["time_ratio"] == 1.0 and r["mem_ratio"] == 1.0
    by = {(r["scheme"], r["length"], r["causal"]): r for r in results}
    # the naive form holds (B, H, S, S) matrices: it needs more memory than fused SDPA
    assert by[("dnas-naive", 64, False)]["peak_bytes"] > by[("unas", 64, False)]["peak_bytes"]
    assert data["config"]["memory_method"] == "torch.profiler allocation records"
    # markdown: our section replaced in place, the others kept
    assert md.count(bench.MD_SECTION) == 1 and "old table to replace" not in md
    assert "kept table" in md and "## Later section\n\nalso kept" in md
    assert md.index("## Training throughput") < md.index(bench.MD_SECTION) < md.index("## Later section")
    assert "| time / UNAS | memory / UNAS |" in md
    rows = [line for line in md.splitlines() if line.startswith("| no ") or line.startswith("| yes ")]
    assert len(rows) == len(results)
    assert {row.split("|")[3].strip() for row in rows} == set(SCHEMES)


def test_attention_bench_guard_records_too_slow_and_skips_longer(tmp_path):
    data, md = run_bench(tmp_path, "--schemes", "dnas", "--max-seconds", "1e-9")
    status = {(r["scheme"], r["length"]): r["status"] for r in data["results"]}
    assert status == {("unas", 32): "too_slow", ("dnas", 32): "too_slow",
                      ("unas", 64): "skipped", ("dnas", 64): "skipped"}
    assert all(r["mem_ratio"] is None for r in data["results"])
    assert "too_slow" in md and "skipped" in md


def test_attention_bench_isolated_case(tmp_path):
    """--isolate runs each case in a subprocess (python -m nas_cli.bench) and reads its result back."""
    data, _ = run_bench(tmp_path, "--schemes", "unas", "--lengths", "32", "--isolate")
    [rec] = data["results"]
    assert rec["scheme"] == "unas" and rec["status"] == "ok" and rec["peak_bytes"] > 0
    assert rec["mem_ratio"] == 1.0 and data["config"]["isolate"] is True


@pytest.mark.parametrize("bad", [
    ["--schemes", "dnas,nope"],
    ["--lengths", "32,abc"],
    ["--lengths", "0"],
    ["--dtype", "int8"],
    ["--causal", "maybe"],
    ["--repeats", "-1"],
])
def test_bad_options_exit_2_with_one_line_error(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["attention", *bad])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("nas-bench attention: error:")
