"""Fig. 1 of the GR paper: loss and gradient of an entry loss against its logit, on an
unannotated label and on a positive, at chosen epochs (:func:`loss_curves`, ``spml
analyze curves``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from probe.engine.trials import expand_grid
from probe.losses import LossInputError, check_hparams, create_loss, get_loss_class

from .common import AnalysisResult, AnalyzeError, check_int, check_losses


@dataclass
class CurvesResult(AnalysisResult):
    """Fig. 1: per loss, variant and epoch, the entry loss and its gradient w.r.t. the logit on
    an unannotated label (y=0) and a positive (y=1), as functions of p."""

    p: list[float]
    curves: list[dict[str, Any]]
    n_epochs: int
    classes: int
    notes: list[str] = field(default_factory=list)

    kind, title, paper = "curves", "Loss and gradient curves (paper Fig. 1)", "Fig. 1"

    def subtitle(self) -> str:
        return (f"per-entry loss ℓ(p) and ∂ℓ/∂z (autograd, z = logit p) over {len(self.p)} "
                f"values of p; schedules over {self.n_epochs} epochs")

    def tables(self):
        probes = [0.1, 0.3, 0.5, 0.7, 0.9]
        p = np.asarray(self.p)
        idx = [int(np.abs(p - q).argmin()) for q in probes]
        header = ["curve", *[f"y=0 ∂ℓ/∂z p={p[i]:.2f}" for i in idx],
                  *[f"y=1 ∂ℓ/∂z p={p[i]:.2f}" for i in idx]]
        rows = [[c["label"], *[f"{c['grad_y0'][i]:.4f}" for i in idx],
                 *[f"{c['grad_y1'][i]:.4f}" for i in idx]] for c in self.curves]
        return [("gradient w.r.t. the logit at a few p (all values in the JSON)", header, rows)]


def _loss_grad(loss_obj: Any, z: Tensor, shape: tuple[int, ...], logits: Any,
               observed: Tensor) -> tuple[Tensor, Tensor]:
    """The loss of ``logits(leaf)`` (``leaf``: ``z`` viewed as ``shape``) and its gradient
    w.r.t. ``leaf``, both flattened."""
    leaf = z.detach().clone().view(shape).requires_grad_(True)
    with torch.enable_grad():
        out = loss_obj(logits(leaf), observed).loss
        (grad,) = torch.autograd.grad(out.sum(), leaf)
    return out.detach().reshape(-1), grad.reshape(-1)


def _entry_curve(loss_obj: Any, z: Tensor, y: int, classes: int
                 ) -> tuple[Tensor, Tensor, str | None]:
    """Per-entry loss and d loss / d z for logits ``z`` (P,) with label ``y`` (every entry its
    own trial: T = P, one sample, ``classes`` identical columns, so the (T,) loss is the entry
    loss), and why the loss is not a function of the entry's own p and label (None when it is):
    the same entries as one batch must give the mean of the per-entry losses, and an entry's
    gradient must not change when the other classes of its sample change."""
    value, grad = _loss_grad(loss_obj, z, (-1, 1, 1), lambda leaf: leaf.expand(-1, 1, classes),
                             torch.full((1, classes), y, dtype=torch.int8))
    tol = {"rtol": 1e-6, "atol": 1e-9}
    p_n = z.numel()
    out, g = _loss_grad(loss_obj, z, (-1, 1), lambda leaf: leaf.expand(-1, classes),
                        torch.full((p_n, classes), y, dtype=torch.int8))
    if not (torch.allclose(out.reshape(()), value.mean(), **tol)
            and torch.allclose(g * p_n, grad, **tol)):
        return value, grad, "its loss depends on the other entries of the batch"
    if classes > 1:
        rest = torch.zeros(p_n, 1, classes - 1, dtype=z.dtype)
        observed = torch.zeros(1, classes, dtype=torch.int8)
        observed[0, 0] = y
        _, g = _loss_grad(loss_obj, z, (-1, 1, 1),
                          lambda leaf: torch.cat([leaf, rest], dim=2), observed)
        if not torch.allclose(g * classes, grad, **tol):
            return value, grad, "an entry's gradient depends on the other classes of its sample"
    return value, grad, None


def loss_curves(
    losses: Sequence[str],
    hparams: dict[str, dict[str, Any]] | None = None,
    *,
    n_epochs: int = 8,
    at: Sequence[int] | None = None,
    points: int = 199,
    classes: int = 20,
) -> CurvesResult:
    """Entry loss ℓ and ∂ℓ/∂z (autograd) of each registered loss on y=0 and y=1 over p ∈
    (0, 1) (Fig. 1). ``hparams``: per loss, values or lists of values (lists give one curve per
    combination, e.g. q3 = 0.001, 0.5, 1 for Fig. 1a). ``at``: epochs of the schedule counted
    from 1 (default: first and last of ``n_epochs``); a loss whose curve does not change over
    them is drawn once. ``classes``: the sample's class count (WAN weights by 1/(C − 1)).

    Only losses whose entry loss depends on that entry's p and label alone can be drawn so;
    stateful losses and ones that depend on the batch or the sample's other classes (EPR, ROLE,
    vPU, ZLPR/OPML, LL after its first epoch, …) raise :class:`AnalyzeError` naming the reason.
    """
    hparams = check_losses(losses, hparams, "is not a loss")
    check_int(n_epochs, "--epochs", 1)
    check_int(points, "--points", 3, 100000)
    check_int(classes, "--classes", 1)
    at = list(at) if at is not None else sorted({1, n_epochs})
    for e in at:
        if isinstance(e, bool) or not isinstance(e, int) or not 1 <= e <= n_epochs:
            raise AnalyzeError(f"--at: epochs are counted from 1 to --epochs {n_epochs}; got {e!r}")
    p = torch.linspace(0.002, 0.998, points, dtype=torch.float64)
    z = torch.logit(p)
    curves: list[dict[str, Any]] = []
    for name in losses:
        cls = get_loss_class(name)
        if cls.stateful:
            raise AnalyzeError(
                f"--loss {name}: keeps per-example state over the train split, so its loss is "
                "not a function of p alone; curves draw losses without state"
            )
        given = {k: (list(v) if isinstance(v, list | tuple) else [v])
                 for k, v in hparams.get(name, {}).items()}
        specs = {s.name: s for s in cls.hparam_specs}
        if unknown := [key for key in given if key not in specs]:  # refused with a hint
            check_hparams(cls.hparam_specs, {unknown[0]: None}, cls.name)
        varied = [k for k, v in given.items() if len(v) > 1]
        for variant in expand_grid(given):
            for spec in specs.values():
                if spec.optional and variant.get(spec.name) is None:
                    raise AnalyzeError(
                        f"--loss {cls.name}: hyperparameter '{spec.name}' has no default "
                        f"({spec.doc}); set it with --set {cls.name}.{spec.name}=VALUE")
            try:
                obj = create_loss(name, **variant)
            except LossInputError as err:
                raise AnalyzeError(f"--set for {name}: {err}") from None
            obj.setup(torch.zeros(1, classes, dtype=torch.int8), n_epochs=n_epochs)
            previous = None
            for e in at:
                obj.start_epoch(e - 1)
                entry = {}
                for y in (0, 1):
                    value, grad, why = _entry_curve(obj, z, y, classes)
                    if not (torch.isfinite(value).all() and torch.isfinite(grad).all()):
                        raise AnalyzeError(
                            f"--loss {name}: non-finite loss or gradient on y={y} with "
                            f"{variant or 'its defaults'} and {classes} classes"
                        )
                    if why:
                        raise AnalyzeError(
                            f"--loss {name} at epoch {e}: not a per-entry function of p ({why}); "
                            "curves draw losses whose entry loss depends on that entry's p and "
                            "label only"
                        )
                    entry[f"loss_y{y}"] = value.tolist()
                    entry[f"grad_y{y}"] = grad.tolist()
                if previous is not None and entry == previous["data"]:
                    previous["epochs"].append(e)
                    continue
                label = name + "".join(f" {k}={variant[k]:g}" if isinstance(variant[k], float)
                                       else f" {k}={variant[k]}" for k in varied)
                previous = {"loss": name, "hparams": dict(variant), "epochs": [e],
                            "data": entry, "base": label}
                curves.append(previous)
    for c in curves:  # epochs are named where another curve has the same loss and values
        data, base = c.pop("data"), c.pop("base")
        same = any(o is not c and o["loss"] == c["loss"] and o["hparams"] == c["hparams"]
                   for o in curves)
        c["label"] = f"{base} @ epoch {','.join(map(str, c['epochs']))}" if same else base
        c.update(data)
    return CurvesResult(p.tolist(), curves, n_epochs, classes)
