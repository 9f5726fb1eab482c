"""The analyses (``spml analyze …``): the GR paper's, computed from the probe engine, one
module each, and two checks of the protocol.

Chen et al., "Boosting Single Positive Multi-label Classification with Generalized Robust Loss",
IJCAI 2024. Each analysis is a plain function that
trains linear probes with :func:`probe.train.train_probe` (or, for the curves, only evaluates a
loss) and returns a result object: numbers, tables and text, no drawing. Its figures are
:mod:`studies.analyses.figures`, whose ``write_outputs`` writes the JSON, Markdown and PNGs;
what they share (seeds, mean ± std, tables, settings, the result base class) is
:mod:`studies.analyses.common`.

* :func:`run_ablation` (:mod:`~studies.analyses.ablation`) — Table 3: GR with k̂, v and the
  robust L on and off (``use_k``, ``use_v``, ``robust``), the learned-(k̂, v) "◦" row
  (``learn_kv``) and the AN baseline. The switches are structural, so every row is its own run;
  the seeds of a row stack (T = seeds).
* :func:`run_sensitivity` (:mod:`~studies.analyses.sensitivity`) — Fig. 2: τ = −b/w swept at
  fixed b_T (w_T = −b_T/τ, Eq. 8), μ_T at fixed σ_T (Eq. 11), a q2 × q3 grid (Eq. 14). All
  points of a sweep (× seeds) train stacked in one run: they are float hyperparameters.
* :func:`run_distinguish` (:mod:`~studies.analyses.distinguish`) — Fig. 3: per epoch, the exact
  1-D Wasserstein-1 distance between the confidences p of the truly positive and the truly
  negative *unannotated* entries (ground truth: the store's full labels), plus their histograms
  at chosen epochs.
* :func:`run_calibration` (:mod:`~studies.analyses.calibration`) — Fig. 5 / Appendix E.3: among
  unannotated train entries, the observed FN/(FN+TN) (fraction truly positive) per confidence
  bucket before and after training, against k̂ = σ(w·p + b) (Eq. 7) at the schedule's start and
  final values and Eq. 6's (1−a)p/(1−a·p) with a = P(s=1 | y=1) measured on the store.
* :func:`loss_curves` (:mod:`~studies.analyses.curves`) — Fig. 1: loss and gradient w.r.t. the
  logit (autograd) of any registered loss whose entry loss depends on that entry's p and label
  only, on an unannotated label (y=0) and on a positive (y=1), at chosen epochs of the loss's
  schedule.
* :mod:`studies.analyses.label_budget` (``spml analyze label-budget``) — how each loss degrades
  as labels get scarcer;
* :mod:`studies.analyses.selection_check` (``spml analyze selection``) — whether a study's
  winner holds up on test, per ``--select`` mode.

Reported mAPs follow docs/protocol.md step 5: the epoch is chosen on val, test mAP is read at that
epoch; several seeds give mean ± sample standard deviation (as ``spml study confirm``).
"""

from __future__ import annotations

from probe._lazy import lazy_exports

# names load on first use: the label-budget and selection checks do not load torch by importing
# this package
_EXPORTS = {
    **dict.fromkeys(("AnalyzeError", "BucketStats", "GR_SWITCHES", "bucket_rates", "check_fixed",
                     "format_table", "k_hat_curve", "scar_curve", "unannotated_truth",
                     "wasserstein_1d"), "studies.analyses.common"),
    **dict.fromkeys(("ABLATION_ROWS", "AblationResult", "AblationRow", "ablation_hparams",
                     "run_ablation"), "studies.analyses.ablation"),
    **dict.fromkeys(("SWEEPS", "SensitivityResult", "Sweep", "run_sensitivity", "sweep_hparams",
                     "sweep_points"), "studies.analyses.sensitivity"),
    **dict.fromkeys(("DistinguishResult", "hist_epochs_for", "run_distinguish"),
                    "studies.analyses.distinguish"),
    **dict.fromkeys(("CalibrationResult", "run_calibration"), "studies.analyses.calibration"),
    **dict.fromkeys(("CurvesResult", "loss_curves"), "studies.analyses.curves"),
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

