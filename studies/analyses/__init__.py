"""The analyses (``spml analyze …``): the GR paper's (Chen et al., "Boosting Single Positive
Multi-label Classification with Generalized Robust Loss", IJCAI 2024), computed from the probe
engine, one module each, and two checks of the protocol. Each is a plain function returning a
result object (numbers, tables, text); :mod:`~studies.analyses.figures` draws it and writes the
JSON, Markdown and PNGs; :mod:`~studies.analyses.common` holds what they share.

* :func:`run_ablation` (:mod:`~studies.analyses.ablation`) -- Table 3, GR's switches;
* :func:`run_sensitivity` (:mod:`~studies.analyses.sensitivity`) -- Fig. 2, τ, μ_T, q2 × q3;
* :func:`run_distinguish` (:mod:`~studies.analyses.distinguish`) -- Fig. 3, W1 between the
  confidences of the truly positive and negative unannotated entries per epoch;
* :func:`run_calibration` (:mod:`~studies.analyses.calibration`) -- Fig. 5, FN/(FN+TN) per
  confidence bucket against k̂ and Eq. 6;
* :func:`loss_curves` (:mod:`~studies.analyses.curves`) -- Fig. 1, loss and gradient vs p;
* :mod:`~studies.analyses.label_budget` (``spml analyze label-budget``) -- how each loss
  degrades as labels get scarcer;
* :mod:`~studies.analyses.selection_check` (``spml analyze selection``) -- whether a study's
  winner holds up on test, per ``--select`` mode.

Reported mAPs follow docs/protocol.md step 5 (epoch chosen on val, test read there); several
seeds give mean ± sample standard deviation (as ``spml study confirm``).
"""

from __future__ import annotations

from probe.lazy import lazy_exports

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

