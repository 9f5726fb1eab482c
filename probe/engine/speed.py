"""How a run uses the machine, kept apart from what it computes: :class:`SpeedOptions`, the knobs
that change how fast a probe runs on the CPU but not its heads (the step loop's thread count, the
trial blocks), passed to :func:`probe.engine.train.train_probe` beside the experiment's
:class:`probe.engine.config.ProbeConfig` and not recorded with it (the run's ``timing`` says what
was used). The step-thread choice is stable (docs/design.md): decided once per machine and step
shape (:func:`choose_threads`) and remembered (:func:`remembered_threads`) -- unless its samples
show another process on the cores (:func:`contended`), then it serves this process only.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probe.errors import SpmlError, is_int, plain
from probe.io import atomic_write_text

if TYPE_CHECKING:
    pass

__all__ = ["CONTENDED_SLOWDOWN", "CONTENDED_SPREAD", "THREAD_MARGIN", "SpeedOptions",
           "choose_threads", "clear_winner", "contended", "cpu_model", "default_cache_dir",
           "remembered_threads", "resolve_speed", "thread_cache_path"]

#: torch's thread setting is used for a step only when its samples beat one thread's by this
#: factor (best and median sample alike): it guards the one remembered measurement against a
#: lucky sample and bounds what the choice can lose (10%)
THREAD_MARGIN = 1.1
#: a calibration shows another process on the cores (:func:`contended`) when the median sample
#: on torch's thread setting is more than this many times one thread's ...
CONTENDED_SLOWDOWN = 2.0
#: ... or when the samples of either setting spread by more than this factor (max / min)
CONTENDED_SPREAD = 2.0
#: the file, under the cache dir, that remembers each step shape's thread choice
THREAD_CACHE_FILE = "step-threads.json"
THREAD_CACHE_FORMAT = 1


@dataclass(frozen=True)
class SpeedOptions:
    """How a probe run uses the CPU; none of these change a trial's result.

    ``step_threads``: CPU threads of the training steps; None: one thread or torch's setting
    (module docstring). ``trial_block``: stacked trials trained together on the CPU, one block
    after the other through each epoch, so that a block's heads and optimizer state stay in
    cache; None: as many as fit :data:`probe.engine.loop.TRIAL_BLOCK_BYTES`; 0: one block.
    ``thread_cache``: remember measured thread choices on disk (False: once per process).
    """

    step_threads: int | None = None
    trial_block: int | None = None
    thread_cache: bool = True

    def validate(self) -> None:
        """Raise :class:`SpmlError` naming the first bad option."""
        if self.step_threads is not None and not is_int(self.step_threads, 1):
            raise SpmlError(f"--step-threads must be left out (one thread, or torch's "
                            f"setting where clearly faster) or a positive integer; got "
                            f"{plain(self.step_threads)}")
        if self.trial_block is not None and not is_int(self.trial_block, 0):
            raise SpmlError(f"--trial-block must be left out (sized to the cache), 0 "
                            f"(one block) or a positive integer (trials per block); got "
                            f"{plain(self.trial_block)}")
        if not isinstance(self.thread_cache, bool):
            raise SpmlError(f"thread_cache must be true or false; got "
                            f"{plain(self.thread_cache)}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_speed(speed: SpeedOptions | None) -> SpeedOptions:
    """The run's :class:`SpeedOptions`: ``speed``, or the defaults, validated."""
    speed = speed if speed is not None else SpeedOptions()
    speed.validate()
    return speed


def clear_winner(one: Sequence[float], many: Sequence[float], margin: float = 1.5) -> bool | None:
    """After two or more rounds of samples (seconds per step): True when every one-thread
    sample beats every sample on torch's setting by ``margin``, False for the reverse, None
    while it is closer than that (then more rounds run and :func:`choose_threads` decides)."""
    if len(one) < 2 or len(many) < 2:
        return None
    if max(one) * margin < min(many):
        return True
    if max(many) * margin < min(one):
        return False
    return None


def choose_threads(one: Sequence[float], many: Sequence[float],
                   margin: float = THREAD_MARGIN) -> int | None:
    """1 (one thread) or None (torch's setting) from timed samples of the same step on each:
    torch's setting only when it beats one thread by ``margin`` on both the best sample and
    the median (a lucky sample or a busy moment alone cannot flip the choice); otherwise one
    thread. Raises :class:`SpmlError` on empty samples."""
    if not one or not many:
        raise SpmlError(f"choose_threads needs samples of both settings; got {len(one)} with "
                        f"one thread and {len(many)} with torch's setting")
    clearly = (min(many) * margin <= min(one)
               and statistics.median(many) * margin <= statistics.median(one))
    return None if clearly else 1


def contended(one: Sequence[float], many: Sequence[float], *,
              slowdown: float = CONTENDED_SLOWDOWN, spread: float = CONTENDED_SPREAD) -> bool:
    """Whether timed samples of a step (seconds per step on one thread, ``one``, and on torch's
    setting, ``many``) show another process on the cores, so that the choice made from them
    must not be remembered for later runs.

    Why these two signs. On a quiet machine torch's multi-threaded step cannot be much slower
    than the one-thread step: an op below torch's parallel grain size runs on one thread anyway,
    and above it the threads split real work, at the cost of a fork and join per op. When
    another process holds a core, an OpenMP thread waits for it at every join, and the step on
    torch's setting becomes many times slower (seen: 0.25-0.74 ms on one thread against 3.5-14
    ms on two; 1.9-3.4 ms against 95 ms) -- its median more than ``slowdown`` times one
    thread's. And on a quiet machine repeated samples of one setting (each ~20 ms of steps)
    agree closely (seen: within 10% and 25%); a neighbour that comes and goes makes them spread
    by more than ``spread`` (max / min) on either setting (seen: 0.87-0.92 ms and 4.9-5.3 ms
    among one setting's samples), which catches contention that hit only some samples, where
    the medians still look plausible. Both bounds are strict: a ratio of exactly ``slowdown`` or
    ``spread`` is quiet. A false alarm costs little (the choice is still made from the samples,
    only measured again by the next process); a missed one is remembered for good. Raises
    :class:`SpmlError` on empty samples or a sample that is not a positive finite number of
    seconds."""
    for name, samples in (("one", one), ("many", many)):
        if not samples:
            raise SpmlError(f"contended needs samples of both settings; got none in {name!r} "
                            f"(seconds per step, one thread and torch's setting)")
        bad = [s for s in samples if not _is_duration(s)]
        if bad:
            raise SpmlError(f"contended needs positive finite seconds per step in {name!r}; "
                            f"got {plain(bad)}; pass the timed samples of the step")
    if statistics.median(many) > slowdown * statistics.median(one):
        return True
    return max(one) > spread * min(one) or max(many) > spread * min(many)


def _is_duration(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


#: the evidence key of the samples on torch's setting (its thread count in the name)
_MANY_KEY = re.compile(r"seconds_per_step_\d+_threads")


def _shows_contention(evidence: dict[str, Any]) -> bool:
    """Whether a calibration's evidence (or a cache entry, which carries it) shows contention
    (:func:`contended`). Without both sample lists there is nothing to judge (False); sample
    lists that are not lists of durations cannot be checked and are not trusted (True)."""
    one = evidence.get("seconds_per_step_one_thread")
    many_keys = [k for k in evidence if _MANY_KEY.fullmatch(k)]
    if one is None or not many_keys:
        return False
    if len(many_keys) > 1:
        return True
    many = evidence[many_keys[0]]
    for samples in (one, many):
        if not isinstance(samples, list) or not samples:
            return True
        if not all(_is_duration(s) for s in samples):
            return True
    return contended(one, many)


def default_cache_dir() -> Path:
    """``$SPML_CACHE_DIR`` if set, else ``~/.cache/spml-probe`` (the bench's synthetic stores
    and the remembered thread choices)."""
    return Path(os.environ.get("SPML_CACHE_DIR") or Path.home() / ".cache" / "spml-probe")


def thread_cache_path() -> Path:
    """Where measured thread choices are remembered (``step-threads.json`` in the cache dir)."""
    return default_cache_dir() / THREAD_CACHE_FILE


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo``, else what :mod:`platform` says."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            return next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")),
                        cpu)
    except OSError:
        return cpu


@functools.cache
def _machine() -> str:
    """What a thread choice depends on besides the step (read once per process)."""
    import torch

    return f"{platform.node()}|{cpu_model()}|{os.cpu_count()}|torch {torch.__version__}"


_REMEMBERED: dict[str, int | None] = {}


def remembered_threads(key: str, measure: Callable[[], tuple[int | None, dict[str, Any]]],
                       *, disk: bool = True, path: Path | None = None) -> int | None:
    """The thread choice for ``key`` (a step shape and torch's thread setting): remembered in
    this process, else read from the cache file (``disk``), else ``measure()`` -- which
    returns the choice and what it was decided from -- remembered in both. A measurement whose
    samples show another process on the cores (:func:`contended`) is taken once more; if that
    one does too, its choice serves this process only and the file is left as it was. An entry
    in the file that shows contention is measured again, so a file written before this check
    heals itself. A cache file that cannot be read or written is ignored (the choice is then
    made once per process)."""
    full = f"{_machine()}|{key}"
    if full in _REMEMBERED:
        return _REMEMBERED[full]
    path = path or thread_cache_path()
    entries = _read_cache(path) if disk else {}
    entry = entries.get(full)
    if (isinstance(entry, dict) and "threads" in entry and entry["threads"] in (1, None)
            and not _shows_contention(entry)):
        choice = entry["threads"]
    else:
        choice, evidence = measure()
        if _shows_contention(evidence):
            # a busy moment (a neighbour starting up, a burst of its work) often passes within
            # the second or so a calibration takes: one more try may give a choice worth
            # remembering, and costs one calibration per shape only while the cores are busy
            choice, evidence = measure()
        if disk and not _shows_contention(evidence):
            entries = _read_cache(path)  # another process may have written meanwhile
            entries[full] = {"threads": choice, **evidence}
            try:
                atomic_write_text(path, json.dumps(
                    {"format": THREAD_CACHE_FORMAT, "choices": entries}, indent=1) + "\n")
            except OSError:
                pass
    _REMEMBERED[full] = choice
    return choice


def _read_cache(path: Path) -> dict[str, dict[str, Any]]:
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(payload, dict) or payload.get("format") != THREAD_CACHE_FORMAT:
        return {}
    choices = payload.get("choices")
    return dict(choices) if isinstance(choices, dict) else {}
