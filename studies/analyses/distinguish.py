"""Fig. 3 of the GR paper: per epoch, the Wasserstein-1 distance between the confidences of
the truly positive and truly negative unannotated entries, and their histograms
(:func:`run_distinguish`, ``spml analyze distinguish``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from probe.engine.config import ProbeConfig
from probe.engine.data import ProbeData
from probe.engine.train import train_probe

from .common import (
    AnalysisResult,
    AnalyzeError,
    check_fixed,
    check_int,
    check_losses,
    format_pm,
    json_floats,
    load_data,
    masked_probs,
    pin_training,
    run_config,
    run_settings,
    seeded_heads,
    trial_scores,
    unannotated_truth,
    wasserstein_1d,
)


class _DistinguishProbe:
    """Per-epoch W1 and histograms of the confidences of the unannotated entries."""

    def __init__(self, x: Tensor, mask: Tensor, truth: Tensor, bins: int) -> None:
        self.x, self.mask, self.bins = x, mask, bins
        self.pos = truth[mask]
        self.w1: list[list[float]] = []  # per evaluated epoch, per trial
        self.hist_pos: list[list[int]] = []  # per evaluated epoch (pooled over trials)
        self.hist_neg: list[list[int]] = []
        self.epochs: list[int] = []  # completed epochs (0 = before training)

    def measure(self, epoch: int, heads: Tensor) -> None:
        w1, hp, hn = [], *torch.zeros(2, self.bins, dtype=torch.float64)
        for t in range(heads.shape[0]):
            p = masked_probs(self.x, heads[t], self.mask)
            pp, pn = p[self.pos], p[~self.pos]
            w1.append(wasserstein_1d(pp, pn))
            hp += torch.histc(pp.double(), self.bins, 0, 1).cpu()
            hn += torch.histc(pn.double(), self.bins, 0, 1).cpu()
        self.epochs.append(epoch)
        self.w1.append(w1)
        self.hist_pos.append(hp.round().long().tolist())
        self.hist_neg.append(hn.round().long().tolist())


@dataclass
class DistinguishResult(AnalysisResult):
    """Fig. 3 on this store: per loss and epoch the W1 distance between the confidences of the
    positive and negative unannotated entries, and their histograms."""

    losses: list[dict[str, Any]]
    split: str
    bins: int
    hist_epochs: dict[str, list[int]]
    settings: dict[str, Any]
    counts: dict[str, int]
    notes: list[str] = field(default_factory=list)

    kind, paper = "distinguish", "Fig. 3"
    title = "Distinguishability of unannotated labels (paper Fig. 3)"

    def tables(self):
        n = len(self.settings["seeds"])
        header = ["epoch", *[f"W1 {r['loss']}" for r in self.losses]]
        rows = []
        for j, e in enumerate(self.losses[0]["epochs"]):
            cells = [f"{r['w1_mean'][j]:.4f}" + (f" ± {r['w1_std'][j]:.4f}" if n > 1 else "")
                     + (" *" if r["best_epoch"] == e else "") for r in self.losses]  # *: best
            rows.append([str(e) + (" (init)" if e == 0 else ""), *cells])
        cap = (f"Wasserstein-1 distance between the confidences p of the truly positive "
               f"({self.counts['positive']}) and truly negative ({self.counts['negative']}) "
               f"unannotated {self.split} entries after each epoch"
               + (f", mean ± std over {n} seeds" if n > 1 else "")
               + "; * = the best val epoch of the first seed")
        score_rows = [[r["loss"], format_pm(r["val_mean"], r["val_std"], n),
                       format_pm(r["test_mean"], r["test_std"], n)] for r in self.losses]
        return [(cap, header, rows),
                ("mAP (%) at the best val epoch", ["loss", "val mAP", "test mAP"], score_rows)]


def hist_epochs_for(spec: Sequence[int | str], n_epochs: int | None, best: int | None = None
                    ) -> list[int]:
    """The completed epochs ``spec`` names (numbers 0..n_epochs, 'best', 'last'), in order,
    without repeats; with ``n_epochs`` None only the kinds of the items are checked."""
    out: list[int] = []
    top = "E" if n_epochs is None else str(n_epochs)
    for item in spec:
        if item == "best":
            e = best if best is not None else n_epochs
        elif item == "last":
            e = n_epochs
        elif isinstance(item, int) and not isinstance(item, bool) and (
                item >= 0 and (n_epochs is None or item <= n_epochs)):
            e = item
        else:
            raise AnalyzeError(
                f"--hist-epochs: expected completed-epoch numbers 0..{top} (0 = before "
                f"training), 'best' or 'last'; got {item!r}"
            )
        if e is not None and e not in out:
            out.append(e)
    if not spec:
        raise AnalyzeError("--hist-epochs: give at least one epoch")
    return out


def run_distinguish(
    data: ProbeData | str,
    config: ProbeConfig | None = None,
    losses: Sequence[str] = ("gr", "an"),
    *,
    hparams: dict[str, dict[str, Any]] | None = None,
    split: str = "train",
    hist_epochs: Sequence[int | str] = (1, "best", "last"),
    bins: int = 50,
    progress: bool = False,
) -> DistinguishResult:
    """Train each loss in turn on ``data`` (or a store path), its seeds stacked, and measure,
    before training and after every epoch, W1 between the confidences of the truly positive and
    truly negative unannotated entries of ``split`` (train by default; the paper used its
    validation images), with ``bins`` histogram bins over [0, 1] at ``hist_epochs`` (completed
    epochs, 0 = before training, or 'best' / 'last'). ``hparams``: per loss name, single values.
    All losses train with the first loss's resolved batch size, lr and epochs."""
    config, seeds = run_config(config)
    hparams = check_losses(losses, hparams, "trains no head; pick a loss")
    if len(set(losses)) != len(losses):
        raise AnalyzeError(f"--loss: a loss is listed twice: {','.join(losses)}")
    check_int(bins, "--bins", 2)
    fixed = {name: check_fixed(name, hparams.get(name)) for name in losses}
    hist_epochs_for(hist_epochs, config.epochs)
    data = load_data(data, config)
    x, mask, truth = unannotated_truth(data, split)
    config = replace(config, eval_every=1)
    init = seeded_heads(seeds, data.feature_dim, data.n_classes)
    out, first = [], None
    for name in losses:
        probe = _DistinguishProbe(x, mask, truth, bins)
        probe.measure(0, init)
        result = train_probe(data, replace(config, seeds=tuple(seeds)), name,
                             [dict(fixed[name]) for _ in seeds], progress=progress,
                             callback=lambda r, p=probe: p.measure(r.epoch, r.heads))  # from 1
        if first is None:
            first = result
            config = pin_training(config, result)
            hist_epochs_for(hist_epochs, config.epochs)  # before the other losses train
        w1 = np.array(probe.w1)  # (epochs + 1, T)
        out.append({
            "loss": name, "hparams": result.trials[0].hparams, "epochs": probe.epochs,
            "w1": json_floats(w1), "w1_mean": json_floats(w1.mean(1)),
            "w1_std": json_floats(w1.std(1, ddof=1) if w1.shape[1] > 1 else 0 * w1.mean(1)),
            "hist_pos": probe.hist_pos, "hist_neg": probe.hist_neg,
            "best_epoch": result.trials[0].best_epoch, **trial_scores(result, range(len(seeds))),
        })
    assert first is not None
    chosen = {r["loss"]: hist_epochs_for(hist_epochs, int(first.config["epochs"]),
                                         r["best_epoch"]) for r in out}
    counts = {"unannotated": int(mask.sum()), "positive": int((mask & truth).sum()),
              "negative": int((mask & ~truth).sum())}
    return DistinguishResult(out, split, bins, chosen, run_settings(data, first, seeds), counts,
                             list(first.config.get("notes", [])))
