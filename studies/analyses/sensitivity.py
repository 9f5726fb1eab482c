"""Fig. 2 of the GR paper: τ, μ_T and a q2 × q3 grid swept, every point stacked in one run
(:func:`run_sensitivity`, ``spml analyze sensitivity``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from probe.engine.config import TRAINER_KEYS, ProbeConfig
from probe.engine.data import ProbeData

from .common import (
    AnalysisResult,
    AnalyzeError,
    check_fixed,
    load_data,
    pin_training,
    run_config,
    run_settings,
    score_cells,
    scores_caption,
    train_runs,
    trial_scores,
)


@dataclass(frozen=True)
class Sweep:
    """One sensitivity analysis of Fig. 2: a swept value × a series value per point."""

    name: str  # tau | mu | q2q3
    x: str  # the swept quantity (tau, mu_T, q2)
    series: str  # the one held fixed per curve (b_T, sigma_T, q3)
    x_default: tuple[float, ...]
    series_default: tuple[float, ...]
    sets: tuple[str, ...]  # the GR hyperparameters a point sets
    needs: dict[str, bool]  # switches that must keep these values for the sweep to mean anything
    figure: str
    x_label: str
    series_label: str
    # (whether a value is in range, why not) of the swept and of the series values
    x_range: tuple[Callable[[float], bool], str] = (math.isfinite, "")
    series_range: tuple[Callable[[float], bool], str] = (math.isfinite, "")


_Q_RANGE = (lambda q: q >= 0,  # q2 and q3 alike
             "q must be >= 0 (0 = the −log limit, 1 = MAE)")
#: Fig. 2a (τ at b_T ∈ {−2, −5, −8}), 2b (μ_T from 0.2 to 1 at σ_T ∈ {0.1, 0.5, 1}), 2c (q2 × q3)
SWEEPS: dict[str, Sweep] = {
    "tau": Sweep("tau", "tau", "b_T", (0.2, 0.4, 0.6, 0.8, 1.0), (-2.0, -5.0, -8.0),
                 ("w_T", "b_T"), {"use_k": True, "learn_kv": False}, "2a",
                 "τ = −b_T / w_T (k̂'s threshold)", "b_T",
                 (lambda x: x > 0, "τ = −b_T/w_T must be > 0 (k̂'s threshold on p; the paper "
                                   "sweeps it in (0, 1])"),
                 (lambda s: s < 0, "b_T must be < 0 so that w_T = −b_T/τ is positive (paper "
                                   "Fig. 2a: −2, −5, −8)")),
    "mu": Sweep("mu", "mu_T", "sigma_T", (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
                (0.1, 0.5, 1.0), ("mu_T", "sigma_T"), {"use_v": True, "learn_kv": False}, "2b",
                "μ_T (centre of v)", "σ_T",
                (lambda x: 0 <= x <= 1, "μ_T is the centre of v over p ∈ [0, 1] (Fig. 2b: "
                                        "0.2 … 1)"),
                (lambda s: s > 0, "σ_T (the width of v) must be > 0")),
    "q2q3": Sweep("q2q3", "q2", "q3", (0.01, 0.1, 0.5, 1.0), (0.01, 0.1, 0.5, 1.0, 1.5),
                  ("q2", "q3"), {"robust": True}, "2c", "q2", "q3", _Q_RANGE, _Q_RANGE),
}


def _sweep(param: str) -> Sweep:
    if param not in SWEEPS:
        raise AnalyzeError(f"--param must be one of {', '.join(SWEEPS)}; got {param!r}")
    return SWEEPS[param]


def sweep_points(param: str, values: Sequence[float] | None = None,
                 series: Sequence[float] | None = None) -> list[dict[str, float]]:
    """The GR hyperparameters of every point of a sweep (series-major: for each series value
    all swept values). ``tau``: ``{"w_T": −b_T/τ, "b_T": b_T}`` (Eq. 8, τ > 0, b_T < 0);
    ``mu``: ``{"mu_T", "sigma_T"}`` (μ_T ∈ [0, 1], σ_T > 0); ``q2q3``: ``{"q2", "q3"}``
    (q ≥ 0). Each point also carries the plotted pair ``x`` / ``series``."""
    sw = _sweep(param)
    xs = tuple(sw.x_default if values is None else values)
    ss = tuple(sw.series_default if series is None else series)
    for name, vals, (ok, want) in ((sw.x, xs, sw.x_range), (sw.series, ss, sw.series_range)):
        if not vals:
            raise AnalyzeError(f"sensitivity {param}: give at least one {name} value")
        for v in vals:  # each value once: finite, then in its range
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise AnalyzeError(f"sensitivity {param}: {name} values must be finite numbers; "
                                   f"got {v!r}")
            if not ok(v):
                raise AnalyzeError(f"sensitivity {param}: {name} = {v:g} is out of range; {want}")
        if len(set(vals)) != len(vals):
            raise AnalyzeError(f"sensitivity {param}: {name} values repeat: {list(vals)}")
    return [{"x": float(x), "series": float(s),
             "hparams": {"w_T": -s / x, "b_T": float(s)} if param == "tau"
             else {sw.x: float(x), sw.series: float(s)}} for s in ss for x in xs]


@dataclass
class SensitivityResult(AnalysisResult):
    """Fig. 2 on this store: val / test mAP at every point of one sweep."""

    param: str
    points: list[dict[str, Any]]
    baseline: dict[str, Any] | None
    settings: dict[str, Any]
    hparams: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        sw = SWEEPS[self.param]
        self.kind, self.paper = f"sensitivity_{self.param}", f"Fig. {sw.figure}"
        what = (f"{sw.x} × {sw.series}" if self.param == "q2q3"
                else f"{sw.x} at fixed {sw.series}")
        self.title = f"GR sensitivity to {what} (paper Fig. {sw.figure})"

    def tables(self):
        sw = SWEEPS[self.param]
        n = len(self.settings["seeds"])
        extra = ["w_T"] if self.param == "tau" else []
        header = [sw.series, sw.x, *extra, "val mAP", "test mAP", "95% interval"]
        rows = [[f"{p['series']:g}", f"{p['x']:g}", *[f"{p['hparams'][k]:.4g}" for k in extra],
                 *score_cells(p, n)] for p in self.points]
        if self.baseline is not None:
            rows.append(["AN baseline", "", *[""] * len(extra), *score_cells(self.baseline, n)])
        cap = scores_caption(n) + f"; all {len(self.points)} points trained stacked in one run"
        return [(cap, header, rows)]

    def to_dict(self) -> dict[str, Any]:
        sw = SWEEPS[self.param]
        return {**super().to_dict(), "analysis": "sensitivity", "x": sw.x, "series": sw.series}


def sweep_hparams(param: str, hparams: dict[str, Any] | None) -> dict[str, Any]:
    """Validate the GR hyperparameters held fixed in a sweep: single values, not the swept
    ones, and no switch that would make the swept ones unused (e.g. use_k=False for τ)."""
    sw = _sweep(param)
    hp = check_fixed("gr", hparams, sw.sets,
                     f"the {param} sweep sets {' and '.join(sw.sets)} itself")
    for key, want in sw.needs.items():
        if key in hp and hp[key] != want:
            raise AnalyzeError(
                f"--set {key}={hp[key]}: the {param} sweep varies {', '.join(sw.sets)}, which "
                f"{key}={hp[key]} makes unused; drop it"
            )
    return hp


def run_sensitivity(
    data: ProbeData | str,
    config: ProbeConfig | None = None,
    param: str = "tau",
    *,
    values: Sequence[float] | None = None,
    series: Sequence[float] | None = None,
    hparams: dict[str, Any] | None = None,
    baseline: bool = True,
    progress: bool = False,
) -> SensitivityResult:
    """One sweep of Fig. 2 (``param`` ∈ :data:`SWEEPS`) on ``data`` (or a store path): every
    point × seed trains stacked in one GR run; ``baseline`` also trains AN with the same
    settings (the red line of Fig. 2).

    ``values``: the swept quantity (τ, μ_T or q2; defaults: the paper's ranges), ``series``:
    the one fixed per curve (b_T, σ_T or q3). ``hparams``: the other GR hyperparameters
    (single values; preset for the dataset, else GR's defaults, when not given).
    """
    config, seeds = run_config(config)
    hp = sweep_hparams(param, hparams)
    points = sweep_points(param, values, series)
    data = load_data(data, config)
    result = train_runs(data, config, "gr", [{**hp, **p["hparams"]} for p in points], seeds,
                        progress)
    base = None
    if baseline:
        an = train_runs(data, pin_training(config, result), "an",
                        [{k: v for k, v in hp.items() if k in TRAINER_KEYS}], seeds, progress)
        base = trial_scores(an, range(len(seeds)))
    n = len(seeds)
    out = [{**p, **trial_scores(result, range(i * n, (i + 1) * n))} for i, p in enumerate(points)]
    return SensitivityResult(param, out, base, run_settings(data, result, seeds), hp,
                             list(result.config.get("notes", [])))
