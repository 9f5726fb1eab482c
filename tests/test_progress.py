"""probe.progress: plain lines in a log (one at once, k/N as work finishes, never a \\r), a
forced refresh only when the count moved, an ETA from this run's own rate."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

from probe.progress import Progress


class _Log(io.StringIO):
    def isatty(self) -> bool:
        return False


def test_lines_in_a_log(monkeypatch):
    monkeypatch.delenv("SPML_PROGRESS", raising=False)
    log = _Log()
    bar = Progress(4, "study s", "trials", file=log, interval=3600, initial=1)
    assert bar.mode == "lines"
    assert log.getvalue() == "study s: starting (4 trials)\n"  # at once
    bar.refresh(force=True)  # the resumed count, once
    bar.refresh(force=True)
    bar.refresh()  # the interval has not passed: nothing
    bar.update(2)
    bar.set_postfix("1 pruned")
    bar.refresh(force=True)
    bar.update(1)  # the last unit: always a line
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert [ln.split(",")[0] for ln in lines] == [
        "study s: starting (4 trials)", "study s: 1/4 trials (25%)", "study s: 3/4 trials (75%)",
        "study s: 4/4 trials (100%)"]
    assert "ETA" in lines[2] and lines[2].endswith("1 pruned")


def test_a_step_says_what_was_done_with_the_status_once(monkeypatch):
    """step(): one line per unit in a log, the message and the status together, and no second
    status line for the last unit when the bar closes; nothing at all when progress is off."""
    monkeypatch.delenv("SPML_PROGRESS", raising=False)
    log = _Log()
    with Progress(2, "re-training", "heads", file=log, interval=3600) as bar:
        bar.step("re-trained trial 3")
        bar.step("re-trained trial 0")
    lines = log.getvalue().splitlines()
    assert len(lines) == 3 and lines[0] == "re-training: starting (2 heads)"
    assert lines[1].startswith("re-trained trial 3 (re-training: 1/2 heads (50%), ")
    assert "ETA" in lines[1] and lines[2].startswith("re-trained trial 0 (re-training: 2/2 heads")
    quiet = _Log()
    with Progress(1, "x", "heads", file=quiet, enabled=False) as bar:
        bar.step("done")
    assert quiet.getvalue() == "" and bar.n == 1


def test_import_in_a_log_is_plain_lines(tmp_path):
    """'spml import yeast' without --quiet, stderr to a file."""
    import pytest

    pytest.importorskip("river", reason="the yeast set ships inside river (extra 'yeast')")
    log = tmp_path / "log"
    with open(log, "w") as fh:
        code = subprocess.call([sys.executable, "-m", "studies.cli", "import", "yeast", "--out",
                                str(tmp_path / "y.zarr")], stderr=fh, stdout=subprocess.DEVNULL,
                               env={"PYTHONPATH": str(Path(__file__).parents[1]),
                                    "PATH": "/usr/bin:/bin"})
    assert code == 0
    text = log.read_text()
    assert "\r" not in text and text.splitlines()[0].startswith("writing y.zarr: starting")
    assert re.match(r"writing y\.zarr: (\d+)/\1 blocks? \(100%\)", text.splitlines()[-1])


def test_heartbeat_lines_while_nothing_finishes(monkeypatch):
    """heartbeat=True: in a log, status lines keep coming while a unit of work takes longer
    than the interval (a study's batch training for minutes); close() stops them. Waits on a
    count of lines, never on a duration."""
    import threading

    monkeypatch.delenv("SPML_PROGRESS", raising=False)
    seen = threading.Event()

    class _Counting(_Log):
        def write(self, text):
            n = super().write(text)
            if self.getvalue().count("epoch 1/8\n") >= 2:  # two beats after set_postfix
                seen.set()
            return n

    log = _Counting()
    bar = Progress(2, "study s", "trials", file=log, interval=0.01, heartbeat=True)
    bar.set_postfix("batch of 2: epoch 1/8")
    assert seen.wait(60), log.getvalue()
    bar.close()
    after = log.getvalue()
    lines = after.splitlines()
    assert lines[0] == "study s: starting (2 trials)" and "\r" not in after
    # a beat may come before set_postfix; every line is a status line of the unchanged count
    assert all(ln.startswith("study s: 0/2 trials (0%)") for ln in lines[1:])
    assert sum(ln.endswith("epoch 1/8") for ln in lines[1:]) >= 2
    assert bar._ticker is not None and not bar._ticker.is_alive()  # stopped with the display


def test_interval_from_the_environment(monkeypatch):
    import pytest

    monkeypatch.setenv("SPML_PROGRESS_INTERVAL", "0")
    log = _Log()
    bar = Progress(3, "x", file=log)
    assert bar.interval == 0.0 and bar._ticker is None
    bar.refresh()  # interval 0: a line at every refresh
    assert log.getvalue().splitlines()[-1].startswith("x: 0/3 it")
    bar.close()
    monkeypatch.setenv("SPML_PROGRESS_INTERVAL", "soon")
    with pytest.raises(ValueError, match=r"SPML_PROGRESS_INTERVAL.*'soon'"):
        Progress(3, "x", file=_Log())


def test_counts_read_in_the_right_number():
    from probe.progress import plural

    cases = [((1, "heads"), "1 head"), ((3, "block"), "3 blocks"), ((1, "block"), "1 block"),
             ((10, "epoch"), "10 epochs"), ((1, "epochs"), "1 epoch"), ((2, "class"), "2 classes"),
             ((1, "classes"), "1 class"), ((5, "B"), "5 B"), ((None, "run"), "runs")]
    for args, want in cases:
        assert plural(*args) == want, args
    log = io.StringIO()
    Progress(1, "probe an", "heads", file=log, interval=3600).close()
    Progress(3, "writing s", "block", file=log, interval=3600).close()
    assert log.getvalue().splitlines()[::2] == ["probe an: starting (1 head)",
                                               "writing s: starting (3 blocks)"]
