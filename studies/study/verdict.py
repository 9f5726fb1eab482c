"""What a study measured, in lines a user can quote: the val winner's val and test mAP (with
the test interval) beside the paper values' (and any reference heads', e.g. the demo's AN),
whether the val winner is better on test, and the commands that settle it.

The winner and the paper point are the heads their trials kept
(``STUDY_DIR/results/heads-*.pt``), else re-trained with the study's settings, seed and draw,
scored on the test split and compared by the paired bootstrap of :mod:`studies.results.compare`.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from studies.study.storage import reference_kind

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
    # what the first trial is: "paper values" (the loss's preset for the dataset) or
    # "defaults" (no preset: its signature defaults and data-derived values), and why
    paper_name: str = "paper values"
    paper_why: str | None = None  # why there is no paper comparison (defaults, or no point)
    p_value: float | None = None  # the pair's raw (uncorrected) p value

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
    trial). ``references``: further :class:`studies.results.compare.System` heads to show beside
    (the demo's AN), with their val mAP in ``reference_val``. ``heads_dir``: where the study kept
    its trials' heads (``STUDY_DIR/results``): those are scored as they are, the others
    re-trained."""
    from optuna.trial import TrialState

    from studies.results.compare import compare_systems, systems_of_study
    from studies.study.storage import is_paper_trial

    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if not complete:
        return None
    systems = systems_of_study(study, study.study_name, top=1, device=device, store=store,
                               heads_dir=heads_dir)
    by_trial, n = {t.number: t for t in complete}, len(systems)  # the winner (and the paper)
    cmp = compare_systems([*systems, *references], store=store, n_resamples=n_resamples,
                          seed=seed, level=level, device=device, allow_one=True)
    vals = [by_trial[s.trial].value for s in systems] + [
        reference_val[j] if j < len(reference_val) else None for j in range(len(references))]
    rows = [VerdictRow(s.label, s.trial if i < n else None, val, iv.value, iv.low, iv.high)
            for i, (s, iv, val) in enumerate(zip([*systems, *references], cmp.intervals, vals))]
    winner_is_paper = is_paper_trial(by_trial[systems[0].trial])
    pair = next(p for p in cmp.pairs if (p.a, p.b) == (0, 1)) if n > 1 else None  # winner − paper
    name, why = _paper_words(study, store, has_point=n > 1 or winner_is_paper)
    if winner_is_paper:
        paper = rows[0]
    else:  # the paper point is the second system, where one ran
        paper = rows[1] if n > 1 else None
    d = pair.diff if pair else None
    return Verdict(winner=rows[0], paper=paper, references=rows[n:], diff=d and d.value,
                   diff_low=d and d.low, diff_high=d and d.high, p_holm=pair and pair.p_holm,
                   n_test=cmp.n_images, level=level, winner_is_paper=winner_is_paper,
                   commands=list(commands), paper_name=name, paper_why=why,
                   p_value=pair and pair.p_value)


def _paper_words(study: Any, store: str, *, has_point: bool) -> tuple[str, str | None]:
    """("paper values" | "defaults", why there is no paper comparison) for a study."""
    loss, settings = study.user_attrs.get("spml.loss"), study.user_attrs.get("spml.settings") or {}
    if not has_point:
        if settings.get("enqueue_paper") is False:
            return "paper values", "no paper point ran (--no-paper): nothing to compare with"
        return "paper values", (f"{loss} has no paper or default values inside the search "
                                "space, so no first trial was enqueued to compare with")
    try:
        from probe.store import open_store

        dataset = open_store(store).dataset
    except Exception:  # a store gone since: say nothing rather than guess
        return "paper values", None
    return reference_kind(loss, dataset)


def settle_commands(study_out: str, storage: str, store: str, *, name: str | None = None,
                    storage_in_out: bool = True) -> list[str]:
    """``spml study confirm`` and ``spml compare`` for a study, quoted to run as printed."""
    q = shlex.quote
    named = f" --name {q(name)}" if name else ""
    out = [f"spml study confirm --storage {q(storage)} --store {q(store)} --top-k 3{named}"
           + ("" if storage_in_out else f" --out {q(study_out)}")]
    if storage_in_out:  # compare finds the study's storage in its folder
        out.append(f"spml compare {q(study_out)}{named}")
    return out


def format_verdict(v: Verdict) -> list[str]:
    """The verdict as lines: the rows, then the sentence, then the commands."""
    from studies.results.compare import disagreement_note, p_phrase

    pct = f"{100 * v.level:g}%"
    pn = v.paper_name
    rows = [("val winner" if not v.winner_is_paper else f"val winner = {pn}", v.winner)]
    if v.paper is not None and not v.winner_is_paper:
        rows.append((pn, v.paper))
    rows += [(r.label, r) for r in v.references]
    width = max(len(name) for name, _ in rows)
    lines = [f"on the test split ({v.n_test} images; {pct} bootstrap intervals), the heads "
             "the trials trained:"]
    for name, r in rows:
        trial = f"trial {r.trial}" if r.trial is not None else ""
        val = f"val mAP {r.val_map:6.2f}" if r.val_map is not None else f"{'':14}"
        lines.append(f"  {name:<{width}}  {trial:<9} {val}   test mAP {r.test_map:6.2f} "
                     f"[{r.test_low:.2f}, {r.test_high:.2f}]")
    if v.paper_why and (v.paper is None or pn != "paper values"):
        lines.append(f"note: {v.paper_why}")
    if v.winner_is_paper:
        lines.append(f"the {pn} won on val: the search found nothing better on val")
    elif v.paper is None:
        if not v.paper_why:
            lines.append("no paper point ran: nothing to compare the winner with")
    else:
        d = f"{v.diff:+.2f} [{v.diff_low:+.2f}, {v.diff_high:+.2f}]"
        if v.better_on_test:
            lines.append(f"the val winner is better than the {pn} on test: {d} "
                         "mAP, paired over the same test images")
        elif v.diff_high is not None and v.diff_high < 0:
            lines.append(f"the val winner is WORSE than the {pn} on test: {d} mAP, "
                         "paired over the same test images; its val lead did not carry over "
                         "(a small val split over-fitted: docs/selection.md)")
        else:
            lines.append(f"the val winner is NOT shown better than the {pn} on test: "
                         f"{d} mAP, paired over the same test images (the interval contains "
                         "0)")
        if v.p_value is not None:
            lines.append(f"  {p_phrase(v.p_value)} (paired bootstrap, uncorrected)"
                         + (f"; {disagreement_note(1 - v.level)}"
                            if (v.p_value < 1 - v.level) != (v.diff_low > 0 or v.diff_high < 0)
                            else ""))
    if v.commands:
        lines.append("settle it: 'spml study confirm' re-trains the top 3 over training seeds "
                     "and single-positive draws; 'spml compare' tests the top 3 and the "
                     f"{pn} on the same images:")
        lines += ["  " + c for c in v.commands]
    return lines
