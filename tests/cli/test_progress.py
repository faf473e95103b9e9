"""Progress lines where stdout is not a terminal (nas_cli/pipeline/progress.py): when a line is due
and how its times read."""
from __future__ import annotations

import pytest

from nas_cli.pipeline import progress


@pytest.mark.parametrize("seconds,text", [(0, "0 s"), (44.6, "45 s"), (65, "1 min 05 s"), (3599, "59 min 59 s"),
                                          (7620, "2 h 07 min")])
def test_durations_read_as_a_person_writes_them(seconds, text):
    assert progress.duration(seconds) == text


def test_a_line_every_tenth_of_the_total_or_every_five_minutes(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    pace = progress._Pace(total=250)
    said = [done for done in range(1, 251) if pace.due(done)]
    assert said == list(range(25, 251, 25))  # every tenth, none in between
    slow = progress._Pace(total=1000)
    assert not slow.due(1)
    now[0] += progress.EVERY_SECONDS  # five minutes without a tenth: a line anyway
    assert slow.due(2) and not slow.due(3)
    assert slow.timing(2) == "5 min 00 s elapsed, about 41 h 35 min left"  # 998 to go at 150 s each
    unknown = progress._Pace(total=0)  # an unsized loader: time only, every five minutes
    now[0] += progress.EVERY_SECONDS
    assert unknown.due(7) and unknown.timing(7) == "5 min 00 s elapsed"


def test_lines_are_chosen_where_stdout_is_not_a_terminal(monkeypatch):
    monkeypatch.setattr(progress.sys.stdout, "isatty", lambda: False, raising=False)
    assert isinstance(progress.progress_callback("run", "val/loss", sweep_job=False), progress.ProgressLines)
    monkeypatch.setattr(progress.sys.stdout, "isatty", lambda: True, raising=False)
    assert not isinstance(progress.progress_callback("run", "val/loss", sweep_job=False), progress.ProgressLines)
    assert isinstance(progress.progress_callback("run", "val/loss", sweep_job=True), progress.ProgressLines)
    # progress_bar=false turns off the bar, not the lines; progress_lines=false the lines
    assert isinstance(progress.progress_callback("run", "val/loss", False, bar=False), progress.ProgressLines)
    assert progress.progress_callback("run", "val/loss", False, bar=False, lines=False) is None
    monkeypatch.setattr(progress.sys.stdout, "isatty", lambda: False, raising=False)
    assert isinstance(progress.progress_callback("run", "val/loss", False, bar=False), progress.ProgressLines)


def test_an_evaluations_lines_come_every_tenth_but_at_most_every_few_seconds(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    fast = progress._Pace(total=16, min_seconds=progress.EVAL_MIN_SECONDS)  # a 1 s evaluation: its first tenth
    assert [d for d in range(1, 17) if (now.__setitem__(0, now[0] + 1 / 16) or fast.due(d))] == [1]
    now[0] = 0.0
    slow = progress._Pace(total=100, min_seconds=progress.EVAL_MIN_SECONDS)  # 1 s per batch: every tenth is rarer
    said = []
    for d in range(1, 101):
        now[0] += 1.0
        if slow.due(d):
            said.append(d)
    assert said == list(range(10, 101, 10))


def test_a_log_file_run_with_progress_bar_false_shows_its_progress_lines(tmp_path):
    from helpers import nas_run

    run = tmp_path / "r"
    proc = nas_run("debug=fast", "progress_lines=true", "progress_bar=false", "logger=csv", f"hydra.run.dir={run}",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = [ln for ln in proc.stdout.splitlines() if ln.startswith("nas-run: r: step ")]
    assert steps and steps[-1].startswith("nas-run: r: step 20 of 20"), proc.stdout[-2000:]
    assert "validation at step 10: val/" in proc.stdout
    quiet = nas_run("debug=fast", "progress_lines=false", "logger=csv", f"hydra.run.dir={tmp_path / 'q'}", cwd=tmp_path)
    assert quiet.returncode == 0 and "nas-run: q: step" not in quiet.stdout
