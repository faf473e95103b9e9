"""``nas-bench attention`` at tiny sizes: output files, ratio columns, guards, bad options."""
import json

import pytest
import torch
from helpers import load_benchmark

from nas_cli.bench import attention as bench_attention
from nas_cli.bench import train as bench_train
from nas_cli.commands import nas_bench

SCHEMES = ["unas", "unas-naive", "dnas", "dnas-naive", "hnas", "sinkhorn"]


def run_bench(tmp_path, *extra):
    out_json, out_md = tmp_path / "bench.json", tmp_path / "benchmarks.md"
    argv = ["attention", "--lengths", "32,64", "--heads", "2", "--d-head", "8", "--repeats", "1",
            "--threads", "1", "--out-json", str(out_json), "--out-md", str(out_md), *extra]
    threads = torch.get_num_threads()
    try:
        assert nas_bench.main(argv) == 0
    finally:  # --threads changes the process-wide setting; leave it as it was
        torch.set_num_threads(threads)
    return json.loads(out_json.read_text()), out_md.read_text()


def test_attention_bench_writes_every_scheme_with_ratios(tmp_path):
    md_path = tmp_path / "benchmarks.md"
    md_path.write_text("# Benchmarks\n\n## Training throughput\n\nkept table\n\n"
                       f"{bench_attention.MD_SECTION}\n\nold table to replace\n\n## Later section\n\nalso kept\n")
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
    assert md.count(bench_attention.MD_SECTION) == 1 and "old table to replace" not in md
    assert "kept table" in md and "## Later section\n\nalso kept" in md
    assert md.index("## Training throughput") < md.index(bench_attention.MD_SECTION) < md.index("## Later section")
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


@pytest.mark.slow  # a benchmark case in a process of its own
def test_attention_bench_isolated_case(tmp_path):
    """--isolate runs each case in a subprocess (python -m nas_cli.bench.attention) and reads its result back."""
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
        nas_bench.main(["attention", *bad])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("nas-bench attention: error:")


# --------------------------------------------------------------------------- nas-bench train

TRAIN_LOOPS = ["reference", "unas", "dnas", "hnas", "dnas-naive"]


def run_train_bench(tmp_path, *extra):
    out_json, out_md = tmp_path / "bench_train.json", tmp_path / "benchmarks.md"
    argv = ["train", "--model", "tiny", "--batch", "4", "--src-len", "8", "--steps", "2", "--warmup-steps", "1",
            "--repeats", "1", "--vocab", "40", "--threads", "1", "--out-json", str(out_json), "--out-md", str(out_md),
            *extra]
    threads = torch.get_num_threads()
    try:
        assert nas_bench.main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    return json.loads(out_json.read_text()), out_md.read_text()


def test_train_bench_rows_ratios_and_markdown(tmp_path):
    md_path = tmp_path / "benchmarks.md"
    md_path.write_text(f"# Benchmarks\n\n{bench_attention.MD_SECTION}\n\nattention table kept\n\n"
                       f"{bench_train.TRAIN_MD_SECTION}\n\nold train table\n\n## Later section\n\nalso kept\n")
    data, md = run_train_bench(tmp_path, "--schemes", "dnas,hnas,dnas-naive")
    results = data["results"]
    assert [r["loop"] for r in results] == TRAIN_LOOPS  # baselines first, then the schemes in order
    tokens = 4 * (8 + 8)
    for r in results:
        assert r["status"] == "ok", r
        assert r["src_len"] == r["tgt_len"] == 8 and r["steps_per_repeat"] == 3
        assert r["tokens_per_s"] > 0 and len(r["repeat_tokens_per_s"]) == 1
        # tokens/s and ms/step describe the same timed steps
        assert r["tokens_per_s"] * r["ms_per_step"] / 1e3 == pytest.approx(tokens)
    by = {r["loop"]: r for r in results}
    # the reference is torch.nn.Transformer with nas-run's sizes: the same parameter count
    assert by["reference"]["parameters"] == by["unas"]["parameters"] > 0
    assert by["hnas"]["parameters"] == by["unas"]["parameters"] + 3 * 2 * 4  # u per location, layer, head
    assert by["reference"]["time_ratio"] is None
    assert by["unas"]["ratio_to"] == "reference" and by["unas"]["target"] == 1.05
    assert by["unas"]["time_ratio"] == pytest.approx(by["reference"]["tokens_per_s"] / by["unas"]["tokens_per_s"])
    for loop, target in (("dnas", 1.15), ("hnas", 1.25), ("dnas-naive", 1.15)):
        assert by[loop]["ratio_to"] == "unas" and by[loop]["target"] == target
        assert by[loop]["time_ratio"] == pytest.approx(by["unas"]["tokens_per_s"] / by[loop]["tokens_per_s"])
        assert by[loop]["target_applies"] is False and by[loop]["met"] is None  # tiny model, length 8
    assert data["config"]["threads"] == 1 and data["config"]["model"] == "tiny"
    # markdown: our section replaced in place, the attention section and the rest kept
    assert md.count(bench_train.TRAIN_MD_SECTION) == 1 and "old train table" not in md
    assert "attention table kept" in md and "## Later section\n\nalso kept" in md
    assert md.index(bench_attention.MD_SECTION) < md.index(bench_train.TRAIN_MD_SECTION) < md.index("## Later section")
    assert "| src len | tgt len | loop | status | tokens/s | ms / step | time ratio | vs | target | met |" in md
    rows = [line.split("|")[1:-1] for line in md.splitlines() if line.startswith("| 8 | 8 |")]
    assert [c[2].strip() for c in rows] == ["reference (torch.nn.Transformer)", "nas-run unas", "nas-run dnas",
                                            "nas-run hnas", "nas-run dnas-naive"]
    ratios = {c[2].strip(): (c[6].strip(), c[7].strip(), c[8].strip(), c[9].strip()) for c in rows}
    assert ratios["nas-run unas"] == (f"{by['unas']['time_ratio']:.3f}", "reference (torch.nn.Transformer)",
                                      "<= 1.05", "n/a")
    assert ratios["nas-run hnas"] == (f"{by['hnas']['time_ratio']:.3f}", "nas-run unas", "<= 1.25", "n/a")
    assert ratios["reference (torch.nn.Transformer)"] == ("-", "-", "-", "-")


def test_train_bench_other_precision_gets_its_own_section(tmp_path):
    """A bf16-mixed run adds its own section (and JSON) next to the float32 table of the targets."""
    md_path = tmp_path / "benchmarks.md"
    md_path.write_text(f"# Benchmarks\n\n{bench_train.TRAIN_MD_SECTION}\n\nfloat32 table kept\n")
    data, md = run_train_bench(tmp_path, "--schemes", "dnas", "--precision", "bf16-mixed")
    assert data["config"]["precision"] == "bf16-mixed" and {r["status"] for r in data["results"]} == {"ok"}
    assert "float32 table kept" in md
    assert bench_train.train_md_section("cpu", "bf16-mixed") == "## End-to-end training (nas-bench train, cpu, bf16-mixed)"
    assert md.index(bench_train.TRAIN_MD_SECTION + "\n") < md.index("## End-to-end training (nas-bench train, cpu, bf16-mixed)")
    assert "bf16-mixed on" in md
    assert bench_train.train_md_section("cpu", "32-true") == bench_train.TRAIN_MD_SECTION


def test_train_targets_apply_only_to_the_issue_setting():
    """met = yes/no only for CPU, model base, lengths 64-128; the ratio decides."""
    rows = [{"src_len": s, "tgt_len": s, "loop": loop, "status": "ok", "tokens_per_s": tps}
            for s in (64, 256) for loop, tps in (("reference", 1000.0), ("unas", 960.0), ("dnas", 800.0),
                                                 ("hnas", 790.0))]
    bench_train.add_train_ratios(rows, "base", "cpu")
    by = {(r["src_len"], r["loop"]): r for r in rows}
    assert by[(64, "unas")]["met"] is True  # 1000 / 960 = 1.042 <= 1.05
    assert by[(64, "dnas")]["met"] is False  # 960 / 800 = 1.2 > 1.15
    assert by[(64, "hnas")]["met"] is True  # 960 / 790 = 1.215 <= 1.25
    assert all(by[(256, loop)]["met"] is None and not by[(256, loop)]["target_applies"]
               for loop in ("unas", "dnas", "hnas"))
    bench_train.add_train_ratios(rows, "base", "cuda")
    assert all(r["met"] is None for r in rows)


def test_train_bench_runs_a_scheme_at_some_locations_only(tmp_path):
    """``dnas@encoder``: DNAS in the encoder, UNAS in the decoder and cross-attention (the issue's
    DNAS-encoder target); ``hnas@decoder+cross``: HNAS's mixing weights at those two only."""
    from nas_cli.model.plan import AttentionPlan

    plan = AttentionPlan.from_config(bench_train._attention_cfg("dnas-naive@encoder"))
    assert plan.names == {"encoder": "dnas", "decoder": "unas", "cross": "unas"}
    assert plan.placed["encoder"].options["impl"] == "naive"
    data, md = run_train_bench(tmp_path, "--schemes", "dnas@encoder,hnas@decoder+cross")
    by = {r["loop"]: r for r in data["results"]}
    assert {r["status"] for r in data["results"]} == {"ok"}
    assert by["dnas@encoder"]["parameters"] == by["unas"]["parameters"]
    assert by["hnas@decoder+cross"]["parameters"] == by["unas"]["parameters"] + 2 * 2 * 4  # 2 locations x 2 layers x 4 heads
    assert by["dnas@encoder"]["ratio_to"] == "unas" and "nas-run dnas@encoder" in md


@pytest.mark.parametrize("bad", [
    ["--schemes", "dnas@decoderr"],
    ["--schemes", "dnas,nope"],
    ["--schemes", "unas-naive"],  # unas has no impl option
    ["--model", "huge"],
    ["--src-len", "0"],
    ["--src-len", "8,16", "--tgt-len", "8,16,32"],
    ["--src-len", "100000"],
    ["--precision", "fp8"],
    ["--warmup-steps", "-1"],
])
def test_train_bad_options_exit_2_with_one_line_error(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        nas_bench.main(["train", "--model", "tiny", *bad])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("nas-bench train: error:")


def test_threads_bench_reports_medians_ranges_and_ratios_paired_by_round():
    """benchmarks/threads.py --repeats: each row the median of its runs with their range; the wall ratio
    of the default policy to threads=1 beside two busy processes is paired within a round."""
    threads = load_benchmark("threads")
    reading, table = threads.reading, threads.table

    def row(setting, busy, rnd, wall, cpu):
        return {"model": "tiny", "threads_setting": setting, "busy": busy, "threads_used": 1, "parameters": 10,
                "wall_per_step_ms": wall, "cpu_per_step_ms": cpu, "env": {}, "round": rnd}

    rows = [row("default policy", 0, r, 100, c) for r, c in enumerate([100, 110, 120])]
    rows += [row("1", 0, r, 100, 100) for r in range(3)]
    rows += [row("default policy", 2, r, w, c) for r, (w, c) in enumerate([(300, 130), (200, 140), (100, 150)])]
    rows += [row("1", 2, r, w, 100) for r, w in enumerate([150, 200, 400])]
    text = table(rows)
    assert "| tiny (10) | default policy (1) | passive | 0 | 3 | 100 ms (100-100) | 110 ms (100-120) | 1.10x |" in text
    said = reading(rows)
    assert "CPU per step 1.27x its quiet" in said  # 140 / 110
    assert "`threads=1` 1.00x, the median over 3 round(s) (per round 0.25x-2.00x)" in said  # 2.0, 1.0, 0.25


def test_adaptive_greedy_bench_checks_the_tokens_and_writes_its_table(tmp_path):
    """benchmarks/adaptive_greedy.py: a row per share of tail words (rising with the head's favour), both
    timings, the table in its own section of the markdown; it leaves torch's thread count as it found it."""
    adaptive_greedy = load_benchmark("adaptive_greedy")

    out_json, out_md = tmp_path / "bench.json", tmp_path / "benchmarks.md"
    threads = torch.get_num_threads()
    try:
        assert adaptive_greedy.main(["--repeats", "1", "--out", str(out_json), "--markdown", str(out_md)]) == 0
    finally:
        torch.set_num_threads(threads)
    rows = json.loads(out_json.read_text())["rows"]
    assert [r["favour"] for r in rows] == [0.0, 2.0, 5.0]
    shares = [r["tail_share"] for r in rows]
    assert shares == sorted(shares) and shares[-1] > 0.2
    assert all(r["predict_s"] > 0 and r["greedy_s"] > 0 for r in rows)
    md = out_md.read_text()
    assert "## The adaptive softmax's greedy words (benchmarks/adaptive_greedy.py)" in md
    assert len([line for line in md.splitlines() if line.startswith("| ") and line.endswith("x |")]) == 3


def test_mixers_bench_times_each_mixer_and_its_step_against_unas(tmp_path):
    """benchmarks/mixers_speed.py at tiny sizes: a row per scheme and length, both timings and their ratios to
    UNAS's (UNAS's own 1), the table in its own section; it leaves torch's thread count as it found it."""
    mixers_speed = load_benchmark("mixers_speed")

    out_json, out_md = tmp_path / "bench.json", tmp_path / "benchmarks.md"
    threads = torch.get_num_threads()
    try:
        assert mixers_speed.main(["--lengths", "16,32", "--heads", "2", "--d-head", "8", "--repeats", "1",
                                  "--out-json", str(out_json), "--out-md", str(out_md)]) == 0
    finally:
        torch.set_num_threads(threads)
    rows = json.loads(out_json.read_text())["results"]
    assert [(r["length"], r["scheme"]) for r in rows] == [(n, s) for n in (16, 32)
                                                          for s in ("unas", *mixers_speed.MIXERS)]
    assert all(r["status"] == "ok" and r["time_ms"] > 0 and r["step_ms"] > 0 for r in rows)
    assert all(r["time_ratio"] == 1.0 and r["step_ratio"] == 1.0 for r in rows if r["scheme"] == "unas")
    md = out_md.read_text()
    assert mixers_speed.MD_SECTION in md and md.count("| 32 | ") == 6
