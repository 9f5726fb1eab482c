"""What a study measured, in lines a user can quote: the val winner's val and test mAP (with
the test interval) beside the paper values' (and any reference heads', e.g. the demo's AN),
whether the val winner is better on test, and the commands that settle it.

The winner and the paper point are re-trained with the study's settings, seed and draw (the
same trials: a trial computes the same alone as stacked, docs/design.md), scored on the test
split, and compared by the paired bootstrap of ``spml compare`` (:mod:`studies.compare`).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Verdict", "VerdictRow", "format_verdict", "settle_commands", "study_verdict"]


@dataclass
class VerdictRow:
    """One measured system: its label, val mAP (None where unknown), test mAP and interval."""

    label: str
    trial: int | None
    val_map: float | None
    test_map: float
    test_low: float
    test_high: float


@dataclass
class Verdict:
    """The val winner against the paper values (and references) on the test split."""

    winner: VerdictRow
    paper: VerdictRow | None
    references: list[VerdictRow]
    diff: float | None  # winner - paper test mAP (paired)
    diff_low: float | None
    diff_high: float | None
    p_holm: float | None
    n_test: int
    level: float
    winner_is_paper: bool
    commands: list[str] = field(default_factory=list)  # what settles it, runnable as printed

    @property
    def better_on_test(self) -> bool | None:
        """True: the winner beats the paper values on test beyond the interval; False: it does
        not (lower, or within the noise); None: no paper point to compare with."""
        if self.paper is None or self.diff is None or self.winner_is_paper:
            return None
        return self.diff_low is not None and self.diff_low > 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "better_on_test": self.better_on_test}


def study_verdict(study: Any, store: str, *, device: str = "cpu",
                  references: Sequence[Any] = (), reference_val: Sequence[float | None] = (),
                  n_resamples: int = 1000, seed: int = 0, level: float = 0.95,
                  commands: Sequence[str] = (), heads_dir: Any = None) -> Verdict | None:
    """The verdict of an opened Optuna study made by ``spml study`` (None without a completed
    trial). ``references``: further :class:`studies.compare.System` heads to show beside (the
    demo's AN), with their val mAP in ``reference_val``. ``heads_dir``: where the study kept
    its trials' heads (``STUDY_DIR/results``): those are scored as they are, the others
    re-trained."""
    from optuna.trial import TrialState

    from .compare import compare_systems, systems_of_study

    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if not complete:
        return None
    systems = systems_of_study(study, study.study_name, top=1, device=device, store=store,
                               heads_dir=heads_dir)
    by_trial = {t.number: t for t in complete}
    cmp = compare_systems([*systems, *references], store=store, n_resamples=n_resamples,
                          seed=seed, level=level, device=device, allow_one=True)

    def row(i: int, val: float | None) -> VerdictRow:
        iv = cmp.intervals[i]
        s = ([*systems, *references])[i]
        trial = s.trial if i < len(systems) else None
        return VerdictRow(s.label, trial, val, iv.value, iv.low, iv.high)

    winner = row(0, by_trial[systems[0].trial].value)
    winner_is_paper = bool(by_trial[systems[0].trial].user_attrs.get("spml:paper"))
    paper = row(1, by_trial[systems[1].trial].value) if len(systems) > 1 else None
    if winner_is_paper:
        paper = winner
    refs = [row(len(systems) + j, reference_val[j] if j < len(reference_val) else None)
            for j in range(len(references))]
    diff = low = high = p = None
    if len(systems) > 1:
        pair = next(pp for pp in cmp.pairs if {pp.a, pp.b} == {0, 1})
        sign = 1.0 if pair.a == 0 else -1.0
        diff = sign * pair.diff.value
        low, high = sorted((sign * pair.diff.low, sign * pair.diff.high))
        p = pair.p_holm
    return Verdict(winner, paper, refs, diff, low, high, p, cmp.n_images, level,
                   winner_is_paper, list(commands))


def settle_commands(study_out: str, storage: str, store: str, *, name: str | None = None,
                    storage_in_out: bool = True) -> list[str]:
    """``spml study confirm`` and ``spml compare`` for a study, quoted to run as printed."""
    q = shlex.quote
    confirm = (f"spml study confirm --storage {q(storage)} --store {q(store)} --top-k 3"
               + (f" --name {q(name)}" if name else "")
               + ("" if storage_in_out else f" --out {q(study_out)}"))
    out = [confirm]
    if storage_in_out:  # compare finds the study's storage in its folder
        out.append(f"spml compare {q(study_out)}" + (f" --name {q(name)}" if name else ""))
    return out


def format_verdict(v: Verdict) -> list[str]:
    """The verdict as lines: the rows, then the sentence, then the commands."""
    pct = f"{100 * v.level:g}%"
    rows = [("val winner" if not v.winner_is_paper else "val winner = paper values", v.winner)]
    if v.paper is not None and not v.winner_is_paper:
        rows.append(("paper values", v.paper))
    rows += [(r.label, r) for r in v.references]
    width = max(len(name) for name, _ in rows)
    lines = [f"on the test split ({v.n_test} images; {pct} bootstrap intervals), re-trained "
             "with the study's settings:"]
    for name, r in rows:
        trial = f"trial {r.trial}" if r.trial is not None else ""
        val = f"val mAP {r.val_map:6.2f}" if r.val_map is not None else f"{'':14}"
        lines.append(f"  {name:<{width}}  {trial:<9} {val}   test mAP {r.test_map:6.2f} "
                     f"[{r.test_low:.2f}, {r.test_high:.2f}]")
    if v.winner_is_paper:
        lines.append("the paper values won on val: the search found nothing better on val")
    elif v.paper is None:
        lines.append("no paper point ran (--no-paper): nothing to compare the winner with")
    else:
        d = f"{v.diff:+.2f} [{v.diff_low:+.2f}, {v.diff_high:+.2f}]"
        if v.better_on_test:
            lines.append(f"the val winner is better than the paper values on test: {d} "
                         "mAP, paired over the same test images")
        elif v.diff_high is not None and v.diff_high < 0:
            lines.append(f"the val winner is WORSE than the paper values on test: {d} mAP, "
                         "paired over the same test images; its val lead did not carry over "
                         "(a small val split over-fitted: docs/selection.md)")
        else:
            lines.append(f"the val winner is NOT shown better than the paper values on test: "
                         f"{d} mAP, paired over the same test images (the interval contains "
                         "0)")
    if v.commands:
        lines.append("settle it: 'spml study confirm' re-trains the top 3 over training seeds "
                     "and single-positive draws; 'spml compare' tests the top 3 and the paper "
                     "values on the same images:")
        lines += ["  " + c for c in v.commands]
    return lines
