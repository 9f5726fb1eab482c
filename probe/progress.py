"""Progress a person can follow, on a terminal or in a log file: the one progress helper.

* stderr is a terminal: a tqdm bar (count, rate, ETA);
* stderr is redirected (a log, CI, ``2>log``): plain lines, never a ``\\r`` -- one at once saying
  what starts, then one at least every ``interval`` seconds while work finishes (``k/N``,
  percent, elapsed, ETA) and one at the end;
* ``enabled=False``: nothing at all (tqdm is then not even imported).

``SPML_PROGRESS=bar|lines|off`` overrides the choice (e.g. ``lines`` for a terminal that keeps a
log); ``SPML_PROGRESS_INTERVAL=SECONDS`` sets the plain lines' cadence (default 10; 0: a line at
every refresh). tqdm is optional: a bare GPU machine without it gets the plain lines.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any, TypeVar

from probe.errors import SpmlError

__all__ = ["INTERVAL_ENV", "PROGRESS_ENV", "Progress", "format_seconds", "plural",
           "progress_mode", "track"]

PROGRESS_ENV = "SPML_PROGRESS"
INTERVAL_ENV = "SPML_PROGRESS_INTERVAL"
DEFAULT_INTERVAL = 10.0  # seconds between plain status lines in a log
_MODES = ("bar", "lines", "off")
T = TypeVar("T")


def progress_mode(enabled: bool = True, file: IO[str] | None = None) -> str:
    """``"bar"``, ``"lines"`` or ``"off"`` for a display on ``file`` (default stderr)."""
    if not enabled:
        return "off"
    forced = os.environ.get(PROGRESS_ENV, "").strip().lower()
    if forced in _MODES:
        return forced
    file = file or sys.stderr
    try:
        return "bar" if file.isatty() else "lines"
    except (AttributeError, ValueError):  # a closed or fake stream
        return "lines"


def _interval() -> float:
    """Seconds between plain status lines: ``$SPML_PROGRESS_INTERVAL`` or 10."""
    text = os.environ.get(INTERVAL_ENV, "").strip()
    if not text:
        return DEFAULT_INTERVAL
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0.0:
        raise SpmlError(f"{INTERVAL_ENV}: expected seconds >= 0 (e.g. 10); got {text!r}")
    return value


#: units that read the same for one and for many (symbols and abbreviations)
_INVARIANT_UNITS = frozenset({"", "it", "B", "img", "s"})


def plural(n: int | None, unit: str) -> str:
    """``n`` and ``unit`` in the right number, whichever number ``unit`` is given in:
    ``plural(1, "heads")`` → ``"1 head"``, ``plural(3, "block")`` → ``"3 blocks"``,
    ``plural(2, "class")`` → ``"2 classes"``; symbols (``B``, ``it``, ``img``) as given.
    ``n`` None: the unit alone, plural."""
    if unit in _INVARIANT_UNITS:
        return unit if n is None else f"{n} {unit}"
    if unit.endswith(("sses", "xes", "ches", "shes")):  # "classes" -> "class"
        one = unit[:-2]
    elif unit.endswith("s") and not unit.endswith("ss"):  # "heads" -> "head"
        one = unit[:-1]
    else:
        one = unit
    many = one + ("es" if one.endswith(("s", "x", "ch", "sh")) and one != "epoch" else "s")
    if n is None:
        return many
    return f"{n} {one if n == 1 else many}"


def format_seconds(seconds: float) -> str:
    """``75.4`` → ``"1:15"``, ``3725`` → ``"1:02:05"``, ``4.2`` → ``"4.2s"``."""
    if seconds != seconds or seconds == float("inf"):
        return "?"
    if seconds < 10:
        return f"{seconds:.1f}s"
    h, rem = divmod(round(seconds), 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """One progress display over ``total`` units (module docstring), also a context manager.

    ``heartbeat``: in a log, a background thread also writes a status line whenever ``interval``
    seconds pass without one (for units of work that take minutes).
    """

    def __init__(self, total: int | None, desc: str, unit: str = "it", *, enabled: bool = True,
                 file: IO[str] | None = None, interval: float | None = None, initial: int = 0,
                 leave: bool = True, heartbeat: bool = False) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.file = file or sys.stderr
        self.mode = progress_mode(enabled, self.file)
        self.interval = _interval() if interval is None else float(interval)
        self.n = self._initial = int(initial)
        self.postfix = ""
        self._start = self._last_line = time.monotonic()
        self._closed = False
        self._bar: Any = None
        self._lock = threading.RLock()  # the heartbeat thread and the caller print in turn
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()
        if self.mode == "bar":
            try:
                from tqdm.auto import tqdm
            except ImportError:  # a bare machine: plain lines instead
                self.mode = "lines"
            else:
                self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.file,
                                 initial=initial, leave=leave, dynamic_ncols=True)
        if self.mode == "lines":
            self._print(f"{desc}: starting ({plural(total, unit)})")
            if heartbeat and self.interval > 0:
                self._ticker = threading.Thread(target=self._beat, name="spml-progress",
                                                daemon=True)
                self._ticker.start()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.mode == "lines":
            now = time.monotonic()
            done = self.total is not None and self.n >= self.total
            if done or now - self._last_line >= self.interval:
                self._status_line(now)

    def step(self, message: str, n: int = 1) -> None:
        """Count ``n`` done and say what was done, with the status, once: in a log one line
        ``message (desc: k/N unit (p%), elapsed, ETA)``; on a terminal the message above the
        bar; nothing when off. The per-unit line of work whose units each take seconds (a
        re-trained head)."""
        if self._bar is not None:
            self._bar.write(message, file=self.file)
            self.update(n)
            return
        self.n += n
        if self.mode == "lines":
            self._status_line(time.monotonic(), message)

    def refresh(self, force: bool = False) -> None:
        """Show the display as of now without counting: in a log, a status line when
        ``interval`` seconds have passed since the last (with ``force``: whenever the count
        changed since the last line); on a terminal, a redraw of the bar."""
        if self._bar is not None:
            self._bar.refresh()
        elif self.mode == "lines":
            now = time.monotonic()
            if (self._last_count != self.n) if force else now - self._last_line >= self.interval:
                self._status_line(now)

    def set_postfix(self, text: str) -> None:
        self.postfix = text
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def write(self, line: str) -> None:
        """A message line (above the bar on a terminal; as is in a log; dropped when off)."""
        if self._bar is not None:
            self._bar.write(line, file=self.file)
        elif self.mode == "lines":
            self._print(line)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._ticker is not None:
            self._stop.set()
            self._ticker.join()
        if self._bar is not None:
            self._bar.close()
        elif self.mode == "lines" and self._last_count != self.n:
            self._status_line(time.monotonic())

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    _last_count = -1

    def status(self, now: float | None = None) -> str:
        """``"desc: k/N unit (p%), elapsed, ETA, postfix"`` as of now."""
        now = time.monotonic() if now is None else now
        elapsed = now - self._start
        count = (f"{self.n}/{plural(self.total, self.unit)}" if self.total is not None
                 else plural(self.n, self.unit))
        parts = [f"{self.desc}: {count}"]
        if self.total:
            parts[0] += f" ({100.0 * self.n / self.total:.0f}%)"
        parts.append(f"{format_seconds(elapsed)} elapsed")
        done_here = self.n - self._initial  # the rate of this run, not of work done before it
        if self.total and done_here > 0 and self.n < self.total:
            parts.append(f"ETA {format_seconds(elapsed / done_here * (self.total - self.n))}")
        if self.postfix:
            parts.append(self.postfix)
        return ", ".join(parts)

    def _status_line(self, now: float, message: str | None = None) -> None:
        with self._lock:
            status = self.status(now)
            self._print(status if message is None else f"{message} ({status})")
            self._last_line, self._last_count = now, self.n

    def _print(self, line: str) -> None:
        with self._lock:
            if self.mode == "off":
                return
            try:
                print(line, file=self.file, flush=True)
            except (BrokenPipeError, ValueError):  # the log went away: keep working silently
                self.mode = "off"

    def _beat(self) -> None:
        """The heartbeat thread: look twice per interval; refresh() prints only when
        ``interval`` seconds have passed since the last line."""
        while not self._stop.wait(self.interval / 2):
            self.refresh()


def track(iterable: Iterable[T], total: int | None = None, desc: str = "", unit: str = "it", *,
          enabled: bool = True, **kwargs: Any) -> Iterator[T]:
    """Iterate ``iterable`` with a :class:`Progress` display (one update per item)."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    with Progress(total, desc, unit, enabled=enabled, **kwargs) as bar:
        for item in iterable:
            yield item
            bar.update()
