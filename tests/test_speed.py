"""Speed options apart from the experiment (probe.engine.speed): the step-thread decision on given
samples (never on timings), remembering it per machine and step shape in the process and on
disk so that a run gets the same setting whatever ran before it, the deprecated ProbeConfig
fields, and that the recorded experiment carries no speed knob."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from fixtures_datasets import toy_probe_arrays

import probe.engine.loop as loop
import probe.engine.speed as speed
from probe import ProbeConfig, SpeedOptions, SpmlError, train_probe
from probe.engine.data import ProbeData
from probe.engine.speed import (
    CONTENDED_SLOWDOWN,
    CONTENDED_SPREAD,
    THREAD_MARGIN,
    choose_threads,
    clear_winner,
    contended,
    remembered_threads,
    resolve_speed,
)


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty in-process memo and a cache file of this test's own."""
    monkeypatch.setattr(speed, "_REMEMBERED", {})
    monkeypatch.setenv("SPML_CACHE_DIR", str(tmp_path))
    return tmp_path / speed.THREAD_CACHE_FILE


def test_a_clear_thread_winner_is_decided_early_a_close_one_later():
    assert clear_winner([1.0], [9.0]) is None  # one round is not enough
    assert clear_winner([1.0, 1.1], [2.0, 1.9]) is True  # 1.1 x 1.5 < 1.9
    assert clear_winner([3.1, 3.2], [1.0, 2.0]) is False  # 2.0 x 1.5 < 3.1
    assert clear_winner([1.0, 1.4], [2.0, 2.0]) is None  # 1.4 x 1.5 > 2.0
    assert clear_winner([1.0, 1.0, 5.0], [2.0, 2.0, 2.0]) is None  # one slow sample


def test_torchs_threads_only_where_clearly_faster_else_one_thread():
    # the measurements the bench saw: one thread 2.3-2.6 s, two threads 4.1 s -> one thread
    assert choose_threads([2.3, 2.6, 2.4], [4.1, 4.1, 4.2]) == 1
    # two threads clearly faster on the best sample and the median -> torch's setting
    assert choose_threads([2.0, 2.1, 2.2], [1.0, 1.2, 1.5]) is None
    # within the margin either way: one thread, never a coin toss between runs
    assert choose_threads([1.0, 1.0, 1.0], [0.95, 0.95, 0.95]) == 1
    assert choose_threads([1.0, 1.0, 1.0], [1.1, 1.1, 1.1]) == 1
    # one lucky sample on torch's setting does not decide
    assert choose_threads([1.0, 1.0, 1.0], [0.5, 1.0, 1.0]) == 1
    # nor a busy moment that slowed one thread's best sample only
    assert choose_threads([2.0, 1.0, 1.0], [0.78, 0.95, 0.95]) == 1
    # exactly at the margin counts as clearly faster
    assert choose_threads([THREAD_MARGIN] * 2, [1.0, 1.0]) is None
    # a step 1.23x faster on torch's setting (COCO's one-trial step on 2 cores) takes it
    assert choose_threads([0.336, 0.334, 0.338], [0.273, 0.272, 0.275]) is None
    assert choose_threads([1.0], [0.5], margin=3.0) == 1
    with pytest.raises(SpmlError, match="samples of both settings"):
        choose_threads([], [1.0])


# calibrations found in a real cache file (ms per step; one thread, two threads): the first
# three ran while another process held a core, QUIET is the first one's shape measured again
# on a quiet machine, where two threads are 1.5x faster
BUSY_START = ([0.248, 0.743], [14.287, 3.45])
BUSY_THROUGHOUT = ([1.854, 3.421], [95.6, 94.345])
BUSY_MOMENTS = ([0.827, 0.664, 0.658, 0.704, 0.982], [0.866, 0.869, 4.868, 5.291, 0.919])
QUIET = ([0.274, 0.263, 0.258, 0.284, 0.269], [0.18, 0.204, 0.164, 0.189, 0.179])


def _evidence(samples: tuple[list[float], list[float]]) -> dict:
    """A calibration's evidence as probe.engine.loop._calibrate writes it (seconds, 2 threads)."""
    one, many = samples
    return {"seconds_per_step_one_thread": [v / 1000 for v in one],
            "seconds_per_step_2_threads": [v / 1000 for v in many]}


def test_contention_is_read_from_the_samples_a_busy_machine_left():
    # torch's setting 18x and 36x slower than one thread on the median: another process
    assert contended(*BUSY_START) and contended(*BUSY_THROUGHOUT)
    # medians 1.3x apart, but two-thread samples 0.87 and 5.3 ms: busy moments
    assert contended(*BUSY_MOMENTS)
    assert not contended(*QUIET)
    # one thread 1.7x faster on every sample, samples agreeing: a plausible quiet measurement
    assert not contended([2.3, 2.6, 2.4], [4.1, 4.1, 4.2])
    # the choices these samples make (a contended one is still a choice for this process)
    assert [choose_threads(*s) for s in (BUSY_START, BUSY_MOMENTS, QUIET)] == [1, 1, None]


def test_the_contention_thresholds_at_their_edges():
    assert CONTENDED_SLOWDOWN == 2.0 and CONTENDED_SPREAD == 2.0
    # the many-thread median exactly 2x one thread's is quiet, a little more is not
    assert not contended([1.0, 1.0, 1.0], [2.0, 2.0, 2.0])
    assert contended([1.0, 1.0, 1.0], [2.0, 2.001, 2.001])
    assert not contended([1.0, 1.0, 1.0], [1.5, 2.0, 3.0])  # median 2.0, spread 2.0: quiet
    # a spread of exactly 2x (max / min) is quiet, a little more is not, on either setting
    assert not contended([1.0, 2.0], [1.0, 1.0])
    assert contended([1.0, 2.001], [1.0, 1.0])
    assert not contended([1.0, 1.0], [0.5, 1.0])
    assert contended([1.0, 1.0], [0.4995, 1.0])
    # torch's setting far faster is no sign of contention; the thresholds can be given
    assert not contended([10.0, 10.0], [1.0, 1.0])
    assert not contended([1.0, 1.0], [3.0, 3.0], slowdown=3.0)
    assert contended([1.0, 1.0], [3.0, 3.0], slowdown=2.9)
    assert contended([1.0, 1.6], [1.0, 1.0], spread=1.5)
    with pytest.raises(SpmlError, match=r"samples of both settings.*'many'"):
        contended([1.0], [])
    with pytest.raises(SpmlError, match=r"positive finite seconds.*'one'"):
        contended([1.0, 0.0], [1.0])
    with pytest.raises(SpmlError, match=r"positive finite seconds.*'many'"):
        contended([1.0], [float("nan")])


def _measure(calls: list, *results: tuple[int | None, dict]):
    """A measure() that returns ``results`` in turn, counting its calls."""
    def run():
        calls.append(len(calls))
        return results[len(calls) - 1]
    return run


def test_a_contended_calibration_serves_this_process_and_is_not_written(fresh):
    calls: list = []
    busy = _measure(calls, (1, _evidence(BUSY_START)), (1, _evidence(BUSY_THROUGHOUT)))
    assert remembered_threads("shape A", busy) == 1
    assert len(calls) == 2  # measured once more before giving up on remembering it
    assert not fresh.exists()  # nothing written for a later run
    assert remembered_threads("shape A", busy) == 1 and len(calls) == 2  # this process keeps it
    # the next process measures again; on a quiet machine the choice is written
    speed._REMEMBERED.clear()
    calls.clear()
    quiet = _measure(calls, (None, _evidence(QUIET)))
    assert remembered_threads("shape A", quiet) is None and len(calls) == 1
    stored = json.loads(fresh.read_text())["choices"][f"{speed._machine()}|shape A"]
    assert stored["threads"] is None
    assert stored["seconds_per_step_2_threads"] == _evidence(QUIET)["seconds_per_step_2_threads"]
    speed._REMEMBERED.clear()
    assert remembered_threads("shape A", _measure(calls)) is None and len(calls) == 1


def test_a_busy_moment_is_measured_again_and_a_quiet_retry_remembered(fresh):
    calls: list = []
    run = _measure(calls, (1, _evidence(BUSY_MOMENTS)), (None, _evidence(QUIET)))
    assert remembered_threads("shape A", run) is None and len(calls) == 2
    stored = json.loads(fresh.read_text())["choices"][f"{speed._machine()}|shape A"]
    assert stored["threads"] is None
    # without the disk cache, the same retry; nothing is written either way
    speed._REMEMBERED.clear()
    fresh.unlink()
    calls.clear()
    run = _measure(calls, (1, _evidence(BUSY_MOMENTS)), (None, _evidence(QUIET)))
    assert remembered_threads("shape A", run, disk=False) is None and len(calls) == 2
    assert not fresh.exists()


def test_a_poisoned_entry_on_disk_is_measured_again_and_replaced(fresh):
    machine = speed._machine()
    entries = {}
    for name, samples in (("busy start", BUSY_START), ("busy moments", BUSY_MOMENTS),
                          ("quiet", QUIET)):
        entries[f"{machine}|{name}"] = {"threads": choose_threads(*samples), **_evidence(samples)}
    # an entry without samples (nothing to judge) stands; one whose samples cannot be read
    # (not a list of durations) is measured again
    entries[f"{machine}|no samples"] = {"threads": 1}
    entries[f"{machine}|bad samples"] = {"threads": 1, "seconds_per_step_one_thread": "fast",
                                         "seconds_per_step_2_threads": [0.1]}
    fresh.write_text(json.dumps({"format": speed.THREAD_CACHE_FORMAT, "choices": entries}))
    calls: list = []
    assert remembered_threads("quiet", _measure(calls)) is None
    assert remembered_threads("no samples", _measure(calls)) == 1
    assert calls == []  # trusted entries are read, not measured
    for name in ("busy start", "busy moments", "bad samples"):
        calls.clear()
        assert remembered_threads(name, _measure(calls, (None, _evidence(QUIET)))) is None
        assert len(calls) == 1
    stored = json.loads(fresh.read_text())["choices"]
    assert len(stored) == 5
    for name in ("busy start", "busy moments", "bad samples"):
        assert stored[f"{machine}|{name}"] == {"threads": None, **_evidence(QUIET)}
    # a poisoned entry measured again while the machine is still busy: used in this process,
    # the file left as it was (and its entry still ignored by the next process)
    entries = {f"{machine}|busy": {"threads": 1, **_evidence(BUSY_THROUGHOUT)}}
    fresh.write_text(json.dumps({"format": speed.THREAD_CACHE_FORMAT, "choices": entries}))
    before = fresh.read_text()
    calls.clear()
    busy = _measure(calls, (1, _evidence(BUSY_START)), (1, _evidence(BUSY_MOMENTS)))
    assert remembered_threads("busy", busy) == 1 and len(calls) == 2
    assert fresh.read_text() == before


def test_a_decision_is_measured_once_then_read_by_every_later_process(fresh):
    calls = []

    def measure(choice):
        def run():
            calls.append(choice)
            return choice, {"seconds_per_step_one_thread": [1.0]}
        return run

    assert remembered_threads("shape A", measure(1)) == 1
    assert remembered_threads("shape A", measure(None)) == 1  # remembered in the process
    assert remembered_threads("shape B", measure(None)) is None  # another shape: its own
    assert calls == [1, None]
    stored = json.loads(fresh.read_text())
    assert stored["format"] == speed.THREAD_CACHE_FORMAT
    assert sorted(str(v["threads"]) for v in stored["choices"].values()) == ["1", "None"]
    # a later process (an empty memo): the remembered choice, even where a measurement made
    # now -- after other work ran in the process -- would come out the other way
    speed._REMEMBERED.clear()
    assert remembered_threads("shape A", measure(None)) == 1
    assert remembered_threads("shape B", measure(1)) is None
    assert calls == [1, None]


def test_without_the_disk_cache_the_choice_is_made_once_per_process(fresh):
    calls = []
    run = lambda: calls.append(1) or (1, {})  # noqa: E731
    assert remembered_threads("k", run, disk=False) == 1
    assert remembered_threads("k", run, disk=False) == 1 and len(calls) == 1
    assert not fresh.exists()
    speed._REMEMBERED.clear()
    remembered_threads("k", run, disk=False)
    assert len(calls) == 2


def test_an_unreadable_or_unwritable_cache_is_ignored(fresh, tmp_path):
    fresh.write_text("{not json")
    assert remembered_threads("k", lambda: (None, {})) is None
    assert json.loads(fresh.read_text())["choices"]  # replaced by a good file
    speed._REMEMBERED.clear()
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert remembered_threads("k", lambda: (1, {}), path=blocked / "x.json") == 1
    speed._REMEMBERED.clear()
    fresh.write_text(json.dumps({"format": 999, "choices": {"x": {"threads": 1}}}))
    assert remembered_threads("k", lambda: (None, {})) is None  # another format: measured
    key = f"{speed._machine()}|k2"
    for bad in ({}, {"threads": 4}, "1", None):  # a damaged entry is measured again
        speed._REMEMBERED.clear()
        fresh.write_text(json.dumps({"format": speed.THREAD_CACHE_FORMAT,
                                     "choices": {key: bad}}))
        assert remembered_threads("k2", lambda: (1, {})) == 1


def test_measured_threads_calibrates_once_per_machine_and_shape(fresh, monkeypatch):
    calls = []
    monkeypatch.setattr(loop, "_calibrate", lambda *a: calls.append(a) or (1, {}))
    cpu = torch.device("cpu")
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the decision is between 1 thread and torch's setting
    try:
        assert loop.resolve_threads(None, cpu, (3, 33, 5), 8, True) == 1
        assert loop.resolve_threads(None, cpu, (3, 33, 5), 8, True) == 1
        assert len(calls) == 1 and torch.get_num_threads() == 2
        loop.resolve_threads(None, cpu, (3, 33, 5), 8, False)
        assert len(calls) == 2  # another step shape is decided on its own
        speed._REMEMBERED.clear()  # a new process: read from the cache file
        loop.resolve_threads(None, cpu, (3, 33, 5), 8, True)
        assert len(calls) == 2
    finally:
        torch.set_num_threads(before)
    assert loop.resolve_threads(4, cpu, (3, 33, 5), 8, True) == 4 and len(calls) == 2
    assert loop.resolve_threads(None, torch.device("meta"), (3, 33, 5), 8, True) is None


def test_the_real_calibration_returns_a_choice_and_its_samples(fresh):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        choice, evidence = loop._calibrate((1, 17, 4), 4, True, 2)
    finally:
        torch.set_num_threads(before)
    assert choice in (1, None)
    one, many = evidence["seconds_per_step_one_thread"], evidence["seconds_per_step_2_threads"]
    assert 2 <= len(one) == len(many) <= 5 and min(one + many) > 0
    # the evidence is the one the contention check reads: samples 100x apart on torch's
    # setting (as a busy core makes them) are seen as contention in it
    assert speed._shows_contention({**evidence, "seconds_per_step_2_threads": [1e-3, 1e-1]})


def _data() -> ProbeData:
    return ProbeData.from_arrays(*toy_probe_arrays(0))


def test_speed_options_train_the_same_heads_and_stay_out_of_the_record(fresh):
    data = _data()
    cfg = ProbeConfig(epochs=2, batch_size=8, lr=1e-2)
    trials = [{"w_T": 2.0}, {"w_T": 6.0}, {"w_T": 10.0}]
    plain = train_probe(data, cfg, "gr", trials, speed=SpeedOptions(step_threads=1))
    blocked = train_probe(data, cfg, "gr", trials,
                          speed=SpeedOptions(step_threads=1, trial_block=1))
    assert blocked.timing["trial_blocks"] == [1, 1, 1] and plain.timing["step_threads"] == 1
    assert torch.equal(plain.final_heads, blocked.final_heads)
    for key in ("step_threads", "trial_block"):
        assert key not in plain.config  # the experiment, not how it ran
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new API warns about nothing
        train_probe(data, cfg, "gr", trials[:1], speed=SpeedOptions(step_threads=1))


def test_speed_is_not_a_probeconfig_field():
    """How a run uses the CPU lives in SpeedOptions only (the experiment's config has no such
    field), and resolve_speed gives the defaults for None."""
    with pytest.raises(TypeError):
        ProbeConfig(step_threads=1)  # type: ignore[call-arg]
    assert resolve_speed(None) == SpeedOptions()
    assert resolve_speed(SpeedOptions(trial_block=0)) == SpeedOptions(trial_block=0)
    with pytest.raises(SpmlError, match="--trial-block"):
        resolve_speed(SpeedOptions(trial_block=-1))


@pytest.mark.parametrize("bad, match", [
    ({"step_threads": 0}, "--step-threads"), ({"step_threads": True}, "--step-threads"),
    ({"trial_block": -1}, "--trial-block"), ({"trial_block": 1.5}, "--trial-block"),
    ({"thread_cache": "yes"}, "thread_cache"),
])
def test_bad_speed_options_are_named(bad, match):
    with pytest.raises(SpmlError, match=match):
        SpeedOptions(**bad).validate()
