"""Pairwise (log-sum-exp) losses — ZLPR (Su et al., arXiv 2208.02955) and OPML (Li, Wang & Chen,
"Pushing One Pair of Labels Apart Each Time in Multi-Label Learning", arXiv 2302.14695, Eqs. 3/6,
10, 11 and Sec. III-E); spec: docs/losses.md "Pairwise losses", the formulas in each class's
``formula``. Each term is a ``logsumexp`` over ``[log α, z_j …]`` / ``[log β, −z_i …]``: exact,
with a finite gradient, for a row without positives (or negatives). OPML's options
(``high_rank``, ``soft``, ``correct``) are **(reconstructed)** from the paper's prose.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from probe.metrics.ranking import column_ap

from ._base import HParam, Loss, LossInputError, LossOutput, register
from ._hparams import check_call, check_inputs, check_state_arg, hp, per_trial, promote

__all__ = ["opml", "opml_correct_labels", "zlpr"]

OPML_PAPER = (
    "Li, Wang & Chen, Pushing One Pair of Labels Apart Each Time in Multi-Label Learning: From "
    "Single Positive to Full Labels, arXiv 2302.14695 (2023)")
ZLPR_PAPER = "Su et al., ZLPR: A Novel Loss for Multi-label Classification, arXiv 2208.02955 (2022)"

_ALPHA = HParam("alpha", 1.0, "constant α in the negative term log(α + Σ_{Ω−} e^z)",
                low=0.0, low_open=True, search=(1e-3, 1e3), log=True)
_BETA = HParam("beta", 1.0, "constant β in the positive term log(β + Σ_{Ω+} e^{−z})",
               low=0.0, low_open=True, search=(1e-3, 1e3), log=True)
_HIGH_RANK = HParam("high_rank", False, "add the high-rank regulariser (reconstructed Eq. 10)",
                    kind="bool")
_HR_LAMBDA = HParam("hr_lambda", 1e-3, "weight λ of the high-rank regulariser (used when "
                    "high_rank=True; paper value lost, reconstructed)", low=0.0,
                    search=(1e-6, 1e-1), log=True, requires="high_rank")
_HR_DELTA = HParam("hr_delta", 1e-4, "δ inside log(σ_i² + δ); keeps the log and its gradient "
                   "finite for rank-deficient P (≥ 1e-8 for a well-conditioned float64 log-det)",
                   low=1e-8, requires="high_rank")
_SOFT = HParam("soft", False, "soft unobserved targets ε = sg(p)·AP_c^g (reconstructed Eq. 11)",
               kind="bool")
_SOFT_POWER = HParam("soft_power", 1.0, "power g on the train AP in ε = sg(p)·AP^g (used when "
                     "soft=True; paper value lost, reconstructed)", low=0.0,
                     search=(0.1, 10.0), log=True, requires="soft")
_CORRECT = HParam("correct", False, "AP-based label correction after every epoch "
                  "(reconstructed Sec. III-E)", kind="bool")
_CORRECT_RATIO = HParam("correct_ratio", 0.1, "ratio r in k_c = round(r·N_c·(1 − AP_c)) flips "
                        "per class and epoch (used when correct=True; reconstructed)", low=0.0,
                        search=(1e-3, 1.0), log=True, requires="correct")

_NEG_INF = -math.inf


def _log_const(value: float | Tensor, z: Tensor) -> Tensor:
    """log of α or β as a ``(..., B, 1)`` column to concatenate in front of the logits."""
    shape = (*z.shape[:-1], 1)
    if isinstance(value, Tensor):
        return torch.log(value).expand(shape)
    return z.new_full(shape, math.log(value))


def _soft_log_weights(z: Tensor, y: Tensor, soft_weight: Tensor | None) -> tuple[Tensor, Tensor]:
    """log of the weights of e^{z} (negative term) and e^{−z} (positive term) per entry.

    Hard labels: (−inf, 0) on y = 1, (0, −inf) elsewhere. With ``soft_weight`` a = AP^g the
    unobserved entries get ε = sg(p)·a: log ε = sg(logσ(z)) + log a and
    log(1 − ε) = log((1 − p) + p(1 − a)), both from logits (exact for p → 1).
    """
    pos = y == 1
    zero, ninf = z.new_zeros(()), z.new_full((), _NEG_INF)
    log_wn = torch.where(pos, ninf, zero)
    log_wp = torch.where(pos, zero, ninf)
    if soft_weight is None:
        return log_wn.expand(z.shape), log_wp.expand(z.shape)
    a = soft_weight.to(z.dtype)
    zd = z.detach()
    # log p, log(1 − p) as −softplus(∓z): F.logsigmoid is slow per call on a busy CPU
    lp, lq = -F.softplus(-zd), -F.softplus(zd)
    log_a = torch.log(a)
    log_eps = lp + log_a
    log_1m_eps = torch.logaddexp(lq, lp + torch.log1p(-a))
    unobs = y == 0
    return torch.where(unobs, log_1m_eps, log_wn), torch.where(unobs, log_eps, log_wp)


def _pair_terms(z: Tensor, y: Tensor, alpha, beta, soft_weight: Tensor | None = None) -> Tensor:
    """Per-sample OPML value ``(..., B)``: logsumexp([log α, z + log w−]) + logsumexp([log β, −z +
    log w+])."""
    log_wn, log_wp = _soft_log_weights(z, y, soft_weight)
    neg = torch.logsumexp(torch.cat([_log_const(alpha, z), z + log_wn], dim=-1), dim=-1)
    pos = torch.logsumexp(torch.cat([_log_const(beta, z), -z + log_wp], dim=-1), dim=-1)
    return neg + pos


def _high_rank(z: Tensor, delta: float | Tensor) -> Tensor:
    """−(1/C)·Σ_i log(σ_i(σ(Z))² + δ) per trial, ``(T,)`` or a scalar, without an SVD:
    Σ_i log(σ_i² + δ) = log det(G + δI), G the smaller Gram matrix (PPᵀ if B ≤ C, else PᵀP), by
    a float64 Cholesky batched over the trials (``svdvals`` reads its convergence flag on the
    host, a sync per step, and may not converge). The gradient 2(PPᵀ + δI)⁻¹P is bounded for
    δ > 0, with no 1/(σ_i² − σ_j²) terms (repeated singular values are safe); δ ≥ 1e-8 keeps
    cond ≤ B·C/δ. ``delta``: a number or the raw ``(T,)`` hyperparameter."""
    p = torch.sigmoid(z).to(torch.float64)
    gram = p @ p.mT if p.shape[-2] <= p.shape[-1] else p.mT @ p  # (..., k, k), k = min(B, C)
    if isinstance(delta, Tensor):
        delta = delta.to(device=z.device, dtype=torch.float64)
        delta = delta.view(-1, 1, 1) if delta.ndim == 1 else delta
    eye = torch.eye(gram.shape[-1], dtype=torch.float64, device=z.device)
    chol, _ = torch.linalg.cholesky_ex(gram + delta * eye)  # no error check → no sync
    logdet = 2.0 * chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    return (-logdet / z.shape[-1]).to(z.dtype)


def _opml_parts(z: Tensor, y: Tensor, alpha, beta, hr_lambda=None, hr_delta=None,
                soft_weight: Tensor | None = None) -> dict[str, Tensor]:
    """Data term (mean over the batch) and, with ``hr_lambda`` given, the weighted regulariser."""
    parts = {"pair": _pair_terms(z, y, alpha, beta, soft_weight).mean(-1)}
    if hr_lambda is not None:
        parts["high_rank"] = per_trial(hr_lambda) * _high_rank(z, hr_delta)
    return parts


def _soft_weight(ap: Tensor, power, z: Tensor) -> Tensor:
    """a = AP^g as ``(T, 1, C)`` / ``(1, C)``; NaN AP (not computed yet) gives a = 0 (ε = 0)."""
    ap = ap.to(device=z.device, dtype=z.dtype)
    power = per_trial(power)
    if isinstance(power, Tensor) and power.ndim == 1:
        power = power.unsqueeze(-1)
    a = torch.where(ap.isnan(), torch.zeros_like(ap), ap.clamp(0, 1).pow(power))
    return a.unsqueeze(-2)


def _correct_core(logits: Tensor, observed: Tensor, flipped: Tensor, ratio, ap: Tensor) -> Tensor:
    """One correction step (:func:`opml_correct_labels`): the new ``(T, N, C)`` flip mask. Per
    (trial, class) the k-th largest eligible score s_k comes from one ``topk``; entries above s_k
    flip, and the lowest rows of those tied at s_k fill the places left (no full sort). Reads
    the largest k on the host once (end of epoch, not the training step)."""
    t, n, c = logits.shape
    eligible = (observed == 0) & ~flipped  # (T, N, C)
    n_pos = (observed == 1).sum(-2).to(torch.float64)  # (C,), per-trial observed (T, C)
    ratio = per_trial(ratio)
    if isinstance(ratio, Tensor):
        ratio = ratio.to(device=logits.device, dtype=torch.float64).reshape(-1, 1)
    ap64 = torch.nan_to_num(ap.to(torch.float64), nan=1.0)  # no AP → nothing to correct
    k = torch.round(ratio * n_pos * (1.0 - ap64)).clamp(0, n).long().expand(t, c)  # (T, C)
    k_max = int(k.max())
    if k_max == 0:
        return flipped.clone()
    scores = torch.where(eligible, logits, torch.full_like(logits, _NEG_INF))
    top = scores.topk(k_max, dim=1).values  # (T, k_max, C), descending
    kth = top.gather(1, (k - 1).clamp(min=0).unsqueeze(1))  # (T, 1, C): the k-th largest score
    above = scores > kth
    tied = scores == kth
    room = k.unsqueeze(1) - above.sum(1, keepdim=True)  # places left for the tie at s_k
    new = above | (tied & (tied.cumsum(1) <= room))
    return flipped | (new & eligible & (k > 0).unsqueeze(1))


def zlpr(logits: Tensor, observed: Tensor) -> Tensor:
    """ZLPR (Su et al. 2022): log(1 + Σ_{Ω−} e^{z}) + log(1 + Σ_{Ω+} e^{−z}), Ω+ = observed
    positives, Ω− = all other labels; mean over the batch."""
    z, y = check_inputs(logits, observed, loss="zlpr")
    return _pair_terms(z, y, 1.0, 1.0).mean(-1)


def opml(logits: Tensor, observed: Tensor, alpha: float | Tensor = 1.0, beta: float | Tensor = 1.0,
         *, high_rank: bool = False, hr_lambda: float | Tensor = 1e-3,
         hr_delta: float | Tensor = 1e-4, soft: bool = False, soft_power: float | Tensor = 1.0,
         ap: Tensor | None = None) -> Tensor:
    """OPML (Li et al. 2023, Eq. 6): log(α + Σ_{Ω−} e^{z}) + log(β + Σ_{Ω+} e^{−z}); batch mean.

    ``alpha``/``beta`` > 0 (numbers or ``(T,)``); α = β = 1 is :func:`zlpr`.
    ``high_rank=True`` adds ``hr_lambda``·(−(1/C)·Σ_i log(σ_i(σ(Z))² + ``hr_delta``)) per trial.
    ``soft=True`` needs ``ap``: the per-class train AP of the observed labels from the last
    epoch, ``(C,)`` or ``(T, C)`` (NaN = not computed yet → ε = 0); unobserved targets become
    ε = sg(p)·AP^``soft_power``. Label correction is a training-loop step: pass the corrected
    labels as ``observed`` (``(B, C)`` or per trial ``(T, B, C)``), see
    :func:`opml_correct_labels`. The options are **(reconstructed)** (module doc).
    """
    given = {_HIGH_RANK: high_rank, _SOFT: soft, _ALPHA: alpha, _BETA: beta}  # switches first
    if high_rank is True:  # the switches' own parameters are checked only when they act
        given.update({_HR_LAMBDA: hr_lambda, _HR_DELTA: hr_delta})
    if soft is True:
        given[_SOFT_POWER] = soft_power
    z, y, values, h = check_call("opml", logits, observed, given)
    weight = _soft_weight(_check_ap(ap, z), h["soft_power"], z) if soft else None
    parts = _opml_parts(z, y, h["alpha"], h["beta"], h.get("hr_lambda"),
                        values.get("hr_delta"), weight)
    return sum(parts.values())


def _check_ap(ap: Tensor | None, z: Tensor) -> Tensor:
    c = z.shape[-1]
    if ap is None:
        raise LossInputError(
            "opml: soft=True needs 'ap', the per-class train average precision (C,) or (T, C) "
            "from the last epoch (e.g. probe.metrics.average_precision(observed == 1, "
            "logits=train_logits)); got None")
    if not isinstance(ap, Tensor) or not ap.is_floating_point():
        raise LossInputError(f"opml: 'ap' must be a float tensor of shape ({c},); got {ap!r}")
    want = [(c,)] + ([(z.shape[0], c)] if z.ndim == 3 else [])
    if tuple(ap.shape) not in want:
        raise LossInputError(
            f"opml: 'ap' must have shape {' or '.join(map(str, want))}; got {tuple(ap.shape)}")
    return ap


@torch.no_grad()
def opml_correct_labels(train_logits: Tensor, observed: Tensor, flipped: Tensor | None = None,
                        correct_ratio: float | Tensor = 0.1, ap: Tensor | None = None) -> Tensor:
    """OPML's AP-based label correction, one epoch's step **(reconstructed, Sec. III-E)**.

    ``train_logits`` ``(N, C)`` or ``(T, N, C)``: the whole train split; ``observed`` ``(N, C)``
    the original labels; ``flipped``: the bool flip mask so far (same shape as the logits, default
    none). For each class c the k_c = round(r·N_c·(1 − AP_c)) highest-scoring entries that are
    unobserved and not yet flipped are flipped (N_c: c's observed positives; ``torch.round``
    rounds half to even; ties → lower row index; fewer eligible entries than k_c → all of them).
    ``ap`` defaults to the AP of the observed positives under ``train_logits``. Returns the new
    mask (old | new).
    """
    z, y, values, _ = check_call("opml_correct_labels", train_logits, observed,
                                 {_CORRECT_RATIO: correct_ratio})
    if flipped is not None:
        flipped = check_state_arg("opml_correct_labels", "flipped", flipped, z, "bool",
                                  "True = flipped to positive earlier",
                                  "torch.zeros_like(train_logits, dtype=torch.bool)", exact=True)
    squeeze = z.ndim == 2
    z = z.unsqueeze(0) if squeeze else z
    flipped = (torch.zeros(z.shape, dtype=torch.bool, device=z.device) if flipped is None
               else flipped.reshape(z.shape))
    ap = (column_ap(z, y == 1) if ap is None
          else _check_ap(ap, z).to(z.device).expand(z.shape[0], z.shape[-1]))
    out = _correct_core(z, y, flipped, values["correct_ratio"], ap)
    return out[0] if squeeze else out


@register
class ZLPR(Loss):
    name = "zlpr"
    stacks_seeds = True  # a (T, B) index: reads no per-example state
    paper = ZLPR_PAPER + "; the α = β = 1 case of OPML (Li et al. 2023, Eq. 6)"
    formula = (
        "per sample: log(1 + Σ_{j∈Ω−} e^{z_j}) + log(1 + Σ_{i∈Ω+} e^{−z_i})\n"
        "Ω+ = observed positives, Ω− = all other labels (AN);  mean over the batch")
    notes = ("Reduction is the mean over the batch (one value per sample), as docs/losses.md "
             "specifies.")
    trial_state = ()  # stateless
    stacks_draws = True  # per-trial (T, B, C) observed: each trial's own sample terms

    def forward(self, logits: Tensor, observed: Tensor, index: Tensor | None = None) -> LossOutput:
        z = promote(logits)
        return LossOutput(_pair_terms(z, observed, 1.0, 1.0).mean(-1), {})


@register
class OPML(Loss):
    name = "opml"
    paper = OPML_PAPER + ", Eq. 6 (options: Eqs. 10, 11, Sec. III-E)"
    formula = (
        "per sample: log(α + Σ_{j∈Ω−} e^{z_j}) + log(β + Σ_{i∈Ω+} e^{−z_i});  mean over the batch\n"
        "high_rank: + λ·(−(1/C)·Σ_i log(σ_i(σ(Z))² + δ))   (Z the batch's B×C logits)\n"
        "soft:      log(α + Σ_j (1−y_j)e^{z_j}) + log(β + Σ_j y_j e^{−z_j}),"
        "  y = ε = sg(p)·AP_c^g on unobserved\n"
        "correct:   after each epoch flip the round(r·N_c·(1 − AP_c)) top-scoring unobserved "
        "train entries of class c to positive")
    hparam_specs = (_ALPHA, _BETA, _HIGH_RANK, _HR_LAMBDA, _HR_DELTA, _SOFT, _SOFT_POWER,
                    _CORRECT, _CORRECT_RATIO)
    # the options soft/correct keep per-trial AP and flips that select_trials does not take:
    # a stopped trial stays in the stack, frozen
    trial_state = None
    # per-trial draws: AP and flips from each trial's own draw (observed_state)
    stacks_draws = True
    # a (T, B) index: its flips are read through state_rows (and written over the whole split)
    stacks_seeds = True
    notes = (
        "(reconstructed) The paper's formulas and numbers could not be recovered, so parts of "
        "this loss are reconstructed: the OPML loss itself follows docs/losses.md (α = β = 1 is "
        "ZLPR); the options high_rank (Eq. 10), soft (Eq. 11) and correct (Sec. III-E) are "
        "implemented from the paper's prose, and their default values and search ranges "
        "(hr_lambda, soft_power, correct_ratio) are this library's choices -- treat results "
        "with these options as an interpretation, not a reproduction. The paper reparametrises "
        "α, β for its grid search without giving the mapping, so α and β are searched "
        "log-uniformly in [1e-3, 1e3]. No per-dataset presets: the paper's training values "
        "(SGD, bs, lr, epochs, α, β, g, r) are not known. AP (soft, correct) is that of the "
        "originally "
        "observed positives on the train split, from the logits of the last finished epoch; "
        "before the first epoch ends ε = 0 and nothing is corrected. The float hyperparameters "
        "of an option only act when its switch (high_rank / soft / correct) is on.")

    def __init__(self, **hparams) -> None:
        super().__init__(**hparams)
        self._set_flags()

    def _set_flags(self) -> None:
        # options are structural: they decide whether the loss keeps state / needs the epoch pass
        self.stateful = bool(self.hparam("correct"))
        self.needs_epoch_pass = bool(self.hparam("soft") or self.hparam("correct"))

    def set_hparam(self, name: str, value) -> None:
        super().set_hparam(name, value)
        self._set_flags()

    def setup(self, observed: Tensor, n_epochs: int, n_trials: int | None = None) -> None:
        super().setup(observed, n_epochs, n_trials)
        if not self.needs_epoch_pass:
            return
        if not isinstance(observed, Tensor) or observed.ndim not in (2, 3):
            got = tuple(observed.shape) if isinstance(observed, Tensor) else type(observed).__name__
            raise LossInputError("opml.setup: 'observed' must be the train split's labels, a "
                                 "(N, C) tensor of -1/0/1 (or (T, N, C), one draw per trial); "
                                 f"got {got}")
        _, y = check_inputs(torch.zeros(observed.shape, device=observed.device), observed,
                            loss="opml.setup")
        self.observed_state("observed_train", y.to(torch.int8), observed)
        self.register_buffer("ap", torch.full((self.n_trials or 1, observed.shape[-1]), math.nan,
                                              device=observed.device))
        if self.hparam("correct"):
            self.per_example("flipped", observed, False, torch.bool)

    def forward(self, logits: Tensor, observed: Tensor, index: Tensor | None = None) -> LossOutput:
        z = promote(logits)
        y = observed
        weight = None
        if self.needs_epoch_pass:
            ap = self.state("ap")  # soft, correct: set up with the train split
            if self.hparam("soft"):
                weight = _soft_weight(ap if z.ndim == 3 else ap[0],
                                      hp(self.hparam("soft_power"), z), z)
            if self.hparam("correct"):
                flips = self.state_rows("flipped", index, z,
                                        "look up its label flips (correct=True keeps them)")
                y = torch.where(flips, torch.ones_like(y), y)
        hr = self.hparam("high_rank")
        parts = _opml_parts(z, y, hp(self.hparam("alpha"), z), hp(self.hparam("beta"), z),
                            hp(self.hparam("hr_lambda"), z) if hr else None,
                            self.hparam("hr_delta") if hr else None, weight)
        return LossOutput(sum(parts.values()), parts)

    @torch.no_grad()
    def end_epoch(self, epoch: int, logits: Tensor | None = None) -> None:
        """Recompute the train AP (soft, correct) and flip labels (correct) from ``logits``
        ``(T, N, C)``, the whole train split through the current head."""
        super().end_epoch(epoch, logits)
        if not self.needs_epoch_pass:
            return
        want = (self.state("ap").shape[0], *self.observed_train.shape[-2:])
        z = promote(self.epoch_logits(logits, want))
        y = self.observed_train.to(z.device)  # (N, C), or per-trial draws (T, N, C)
        if y.ndim == 2:
            ap = column_ap(z, y == 1)
        else:  # each trial's AP against its own draw's positives
            ap = torch.stack([column_ap(z[t], y[t] == 1) for t in range(y.shape[0])])
        self.ap.copy_(ap)
        if self.hparam("correct"):
            ratio = self.hparam("correct_ratio")
            self.flipped.copy_(_correct_core(z, y, self.flipped.to(z.device), ratio, ap))
