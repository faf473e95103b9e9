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
