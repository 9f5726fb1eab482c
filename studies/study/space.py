"""Search spaces: declared once next to each loss (``HParam.search`` / ``HParam.log``) and turned
into Optuna distributions here. Names are prefixed by the loss (``gr.w_T``) or ``train.``
(``train.lr`` log-uniform, ``train.batch_size`` / ``train.epochs`` categorical); the paper's
values (``SearchSpace.defaults``) are the first trial a study enqueues.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
)

from probe.engine.config import resolve_training
from probe.losses import HParam, LossInputError, check_hparam, get_loss_class
from studies.study.storage import StudyError

__all__ = ["SearchSpace", "build_space", "parse_range", "range_text"]

TRAIN_PREFIX = "train."
# valid values of the searchable training settings (what probe.engine.config.ProbeConfig accepts)
TRAIN_HPARAMS: dict[str, HParam] = {
    "lr": HParam("lr", None, "the head's learning rate", low=0.0, low_open=True),
    "batch_size": HParam("batch_size", None, "rows per step", kind="int", low=1),
    "epochs": HParam("epochs", None, "training epochs", kind="int", low=1),
}


@dataclass(frozen=True)
class SearchSpace:
    """The distributions of one study and how to split a sampled point into loss / train parts."""

    loss: str
    distributions: dict[str, BaseDistribution]
    defaults: dict[str, Any] = field(default_factory=dict)  # the paper point, same names
    notes: tuple[str, ...] = ()  # what the command changed about the space (log lines)

    def split(self, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """``{"gr.w_T": 5, "train.lr": 1e-4}`` → ``({"w_T": 5}, {"lr": 1e-4})``."""
        loss_part, train_part = {}, {}
        for name, value in params.items():
            if name.startswith(TRAIN_PREFIX):
                train_part[name[len(TRAIN_PREFIX) :]] = value
            elif name.startswith(self.loss + "."):
                loss_part[name[len(self.loss) + 1 :]] = value
            else:
                raise StudyError(f"parameter '{name}' belongs to neither '{self.loss}.' nor "
                                 "'train.'")
        return loss_part, train_part


def parse_range(text: str) -> tuple[str, BaseDistribution]:
    """``--space NAME=LOW:HIGH[:log]`` or ``NAME=a,b,c`` (categorical) → (name, distribution)."""
    if "=" not in text:
        raise StudyError(f"--space: expected NAME=LOW:HIGH[:log] or NAME=A,B,C; got {text!r}")
    name, spec = (s.strip() for s in text.split("=", 1))
    if ":" in spec:
        bits = spec.split(":")
        log = len(bits) == 3 and bits[2] == "log"
        if len(bits) not in (2, 3) or (len(bits) == 3 and not log):
            raise StudyError(f"--space {name}: expected LOW:HIGH or LOW:HIGH:log; got {spec!r}")
        try:
            low, high = float(bits[0]), float(bits[1])
        except ValueError:
            raise StudyError(f"--space {name}: LOW and HIGH must be numbers; got {spec!r}") \
                from None
        return name, _float_dist(name, low, high, log)
    choices = []
    for item in spec.split(","):
        try:
            choices.append(int(item) if item.strip().lstrip("-").isdigit() else float(item))
        except ValueError:
            raise StudyError(f"--space {name}: choices must be numbers; got {item!r}") from None
    if not choices:
        raise StudyError(f"--space {name}: the list of choices is empty")
    return name, CategoricalDistribution(tuple(choices))


def _float_dist(name: str, low: float, high: float, log: bool) -> FloatDistribution:
    if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
        raise StudyError(f"search space for '{name}' is empty or inverted: low={low:g} must be "
                         f"< high={high:g}")
    if log and low <= 0:
        raise StudyError(f"search space for '{name}': a log scale needs low > 0; got {low:g}")
    return FloatDistribution(low, high, log=log)


def build_space(loss: str, dataset: str | None = None, *, search_lr: bool = False,
                batch_sizes: tuple[int, ...] = (), epochs: tuple[int, ...] = (),
                overrides: dict[str, BaseDistribution] | None = None,
                only: tuple[str, ...] | None = None, fixed: dict[str, Any] | None = None
                ) -> SearchSpace:
    """The study's space for ``loss``: every hparam with a declared search range (or just
    ``only``), plus optional training settings, with ``overrides`` (from ``--space``).

    A parameter that only matters under a switch (``HParam.requires``, e.g. OPML's
    ``hr_lambda`` under ``high_rank``) is searched only when ``fixed`` turns the switch on."""
    cls = get_loss_class(loss)
    specs = {s.name: s for s in cls.hparam_specs}
    preset = {**{s.name: s.default for s in cls.hparam_specs}, **cls.presets.get(dataset or "", {})}
    # the paper point's training settings are what a probe uses by default (the head's rate)
    paper_train = resolve_training(cls, dataset or "")
    dists: dict[str, BaseDistribution] = {}
    defaults: dict[str, Any] = {}
    switches = {**preset, **(fixed or {})}
    if only is None:
        only = tuple(n for n, s in specs.items()
                     if s.search is not None and (s.requires is None or switches.get(s.requires)))
    for name in only:
        if name not in specs:
            raise StudyError(f"--params: '{name}' is not a hyperparameter of {loss} (known: "
                             f"{', '.join(specs)})")
        spec = specs[name]
        if spec.requires is not None and not switches.get(spec.requires):
            raise StudyError(
                f"--params: {loss}.{name} only matters with {spec.requires}=true; add "
                f"--set {spec.requires}=true to search it"
            )
        if spec.search is None or not spec.stackable:
            raise StudyError(f"--params: {loss}.{name} has no numeric search range; set it with "
                             "--set instead")
        dists[f"{loss}.{name}"] = _float_dist(f"{loss}.{name}", *spec.search, spec.log)
        defaults[f"{loss}.{name}"] = preset.get(name)
    for key, dist in (("lr", search_lr and FloatDistribution(1e-5, 1e-1, log=True)),
                      ("batch_size", batch_sizes and CategoricalDistribution(tuple(batch_sizes))),
                      ("epochs", epochs and CategoricalDistribution(tuple(epochs)))):
        if dist:
            dists[TRAIN_PREFIX + key] = dist
            defaults[TRAIN_PREFIX + key] = getattr(paper_train, key)
    for name, dist in (overrides or {}).items():
        full = name if "." in name else f"{loss}.{name}"
        if not (full.startswith(loss + ".") or full.startswith(TRAIN_PREFIX)):
            raise StudyError(f"--space: '{name}' is neither a {loss} hyperparameter nor train.*")
        if full.startswith(loss + ".") and full[len(loss) + 1 :] not in specs:
            raise StudyError(f"--space: '{full}' is not a hyperparameter of {loss} (known: "
                             f"{', '.join(specs)})")
        dists[full] = dist
        defaults.setdefault(full, preset.get(full[len(loss) + 1 :]))
    for full, dist in dists.items():
        part = full[len(TRAIN_PREFIX) :] if full.startswith(TRAIN_PREFIX) else None
        spec = TRAIN_HPARAMS.get(part) if part is not None else specs[full[len(loss) + 1 :]]
        if spec is None:
            raise StudyError(
                f"--space: '{full}' is not a searchable training setting (known: "
                f"{', '.join(TRAIN_PREFIX + k for k in TRAIN_HPARAMS)})"
            )
        check_within(full, dist, spec)
    if not dists:
        raise StudyError(
            f"the search space for {loss} is empty: it declares no searchable hyperparameter; "
            "add ranges with --space NAME=LOW:HIGH or search train settings (--search-lr)"
        )
    # the paper point must lie inside the space to be enqueued
    defaults = {k: v for k, v in defaults.items() if v is not None and _contains(dists[k], v)}
    return SearchSpace(loss, dists, defaults)


def check_within(name: str, dist: BaseDistribution, spec: HParam) -> None:
    """StudyError unless every value ``dist`` can sample is valid for ``spec`` (a range's two
    ends, or each choice), naming the parameter, the search range and the valid range."""
    values = (list(dist.choices) if isinstance(dist, CategoricalDistribution)
              else [dist.low, dist.high])  # type: ignore[attr-defined]
    shown = range_text(dist)
    if spec.kind == "int" and isinstance(dist, FloatDistribution):
        raise StudyError(
            f"--space {name}: {shown} is a continuous range but {name} takes integers in "
            f"{spec.range_text()}; give the values to try as a list, e.g. {name}=8,16,32"
        )
    for value in values:
        try:
            check_hparam(spec, value)
        except LossInputError:
            raise StudyError(
                f"--space {name}: the search range {shown} is not inside {name}'s valid range "
                f"{spec.range_text()} ({value!r} is not valid); nothing was created -- choose "
                "a range inside it"
            ) from None


def range_text(dist: BaseDistribution) -> str:
    """A distribution as messages and the report show it: ``{a, b}`` (choices), ``[low, high]``."""
    if isinstance(dist, CategoricalDistribution):
        return "{" + ", ".join(map(str, dist.choices)) + "}"
    return f"[{dist.low:g}, {dist.high:g}]"  # type: ignore[attr-defined]


def _contains(dist: BaseDistribution, value: Any) -> bool:
    if isinstance(dist, CategoricalDistribution):
        return value in dist.choices
    try:
        return dist.low <= float(value) <= dist.high  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        return False
