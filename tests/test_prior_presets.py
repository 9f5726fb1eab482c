"""The prior losses' presets are the authors' released configs, and ``released=True`` is the
released code: each preset value below is copied from the file and field named beside it
(Fsoft-AIC/AEVLP configs/*.json and config.py; mvrl/VLPL main_clip.py), and the reference
functions are written fresh here from the released get_pseudo_labels, GPR_loss, train.py
schedules, models.py's pseudo-labels and loss_EM_PL."""

from __future__ import annotations

import sys

import pytest
import torch

from probe.losses import create_loss, get_loss_class

# (source file, field, value as written there, loss, dataset, where it lands)
AEVLP = "Fsoft-AIC/AEVLP"
VLPL = "mvrl/VLPL"
_CONFIG = {"coco": "configs/coco.json", "voc": "configs/pascal.json",
           "nus": "configs/nuswide.json", "cub": "configs/cub.json"}
_AEVLP_FILES = {
    # dataset: beta, alpha, q2q3, lam, rho, reg, eta, threshold, negative_ratio, bsize, lr,
    # num_epochs, lr_mult
    "coco": ([0, 10, -2, -8], [0.5, 2, 0.8, 0.5], [0.01, 1], [0.7, 0.5], 0.9, 0.001, 0.3, 0.5,
             0.3, 16, 1e-05, 8, 10),
    "voc": ([0, 2, -2, -2], [0.5, 2, 0.8, 0.5], [0.01, 1], [0.7, 0.4], 0.9, 0.05, 0.0, 0.5, 0.2,
            8, 1e-5, 8, 10),
    "nus": ([0, 10, -2, -8], [0.5, 2, 0.8, 0.5], [0.01, 1], [0.7, 0.5], 0.9, 0.001, 0.3, 0.6,
            0.2, 16, 1e-05, 10, 10),
    "cub": ([0, 10, -2, -8], [0.5, 2, 0.8, 0.5], [0.01, 1.5], [0.8, 0.2], 0.9, 0.01, 0.005,
            0.005, 0.2, 8, 1e-05, 10, 10),
}
# config.py _LOOKUP (the json files do not set them): 'top_k' and 'expected_num_pos'
_AEVLP_LOOKUP = {"voc": (3, 1.5), "coco": (3, 2.9), "nus": (3, 1.9), "cub": (32, 31.4)}


def _aevlp_rows() -> list[tuple]:
    rows = []
    for ds, (beta, alpha, q, lam, rho, reg, eta, thr, neg, bsize, lr, epochs, mult) in (
            _AEVLP_FILES.items()):
        f = f"{AEVLP} {_CONFIG[ds]}"
        rows += [(f, f"beta[{i}]", beta[i], "gpr", ds, k)
                 for i, k in enumerate(("w_0", "w_T", "b_0", "b_T"))]
        rows += [(f, f"alpha[{i}]", alpha[i], "gpr", ds, k)
                 for i, k in enumerate(("mu_0", "sigma_0", "mu_T", "sigma_T"))]
        rows += [(f, "q2q3[0]", q[0], "gpr", ds, "q2"), (f, "q2q3[1]", q[1], "gpr", ds, "q3"),
                 (f, "lam[0]", lam[0], "gpr", ds, "lam1"), (f, "lam[1]", lam[1], "gpr", ds, "lam2"),
                 (f, "rho", rho, "gpr", ds, "rho"), (f, "reg", reg, "gpr", ds, "reg"),
                 (f, "eta", eta, "gpr", ds, "eta"), (f, "threshold", thr, "gpr", ds, "threshold"),
                 (f, "negative_ratio", neg, "gpr", ds, "neg_ratio"),
                 (f, "bsize", bsize, "gpr", ds, "train:batch_size"),
                 (f, "lr", lr, "gpr", ds, "train:lr"),
                 (f, "num_epochs", epochs, "gpr", ds, "train:epochs"),
                 (f, "lr_mult", mult, "gpr", ds, "train:head_lr_mult")]
        top_k, expected = _AEVLP_LOOKUP[ds]
        rows += [(f"{AEVLP} config.py", f"_LOOKUP['top_k'][{ds!r}]", top_k, "gpr", ds, "top_k"),
                 (f"{AEVLP} config.py", f"_LOOKUP['expected_num_pos'][{ds!r}]", expected, "gpr",
                  ds, "k")]
    return rows


# mvrl/VLPL main_clip.py, the per-dataset block (pascal/coco/nuswide/cub) and argparse defaults
_VLPL_FILES = {"voc": (0.2, 1e-5), "coco": (0.1, 1e-5), "nus": (0.1, 1e-5), "cub": (0.01, 1e-4)}


def _vlpl_rows() -> list[tuple]:
    f = f"{VLPL} main_clip.py"
    rows = []
    for ds, (alpha, lr) in _VLPL_FILES.items():
        rows += [(f, "P['alpha']", alpha, "vlpl", ds, "alpha"),
                 (f, "P['beta_pos']", 0.7, "vlpl", ds, "beta_pos"),
                 (f, "P['beta_neg']", 0.0, "vlpl", ds, "beta_neg"),
                 (f, "P['warmup_epoch']", 0, "vlpl", ds, "warmup_epochs"),
                 (f, "--threshold default", 0.3, "vlpl", ds, "threshold"),
                 (f, "--partial default (int(partial * C) negatives)", 0.0, "vlpl", ds, "k_neg"),
                 (f, "P['bsize']", 8, "vlpl", ds, "train:batch_size"),
                 (f, "P['lr']", lr, "vlpl", ds, "train:lr"),
                 (f, "P['num_epochs']", 10, "vlpl", ds, "train:epochs")]
    return rows


@pytest.mark.parametrize(("source", "field", "value", "loss", "dataset", "key"),
                         _aevlp_rows() + _vlpl_rows(),
                         ids=lambda v: str(v) if not isinstance(v, float) else None)
def test_each_preset_value_is_the_released_configs(source, field, value, loss, dataset, key):
    cls = get_loss_class(loss)
    if key.startswith("train:"):
        got = cls.train_presets[dataset][key.removeprefix("train:")]
    else:
        got = cls.presets[dataset][key]
    assert got == value, f"{loss} {dataset} {key}: {got} but {source} {field} is {value}"


def test_the_presets_set_nothing_the_table_does_not_hold():
    table = {(loss, ds, key) for *_, loss, ds, key in _aevlp_rows() + _vlpl_rows()}
    for name in ("gpr", "vlpl"):
        cls = get_loss_class(name)
        for ds, values in cls.presets.items():
            assert {(name, ds, k) for k in values} <= table, (name, ds)
        for ds, values in cls.train_presets.items():
            assert {(name, ds, f"train:{k}") for k in values} <= table, (name, ds)


# ----------------------------------------------------------------------------- released code
def _aevlp_pseudo_labels(g, tmax, tmin, tmean, label_vec, P):
    """utils.get_pseudo_labels' second value, from the per-class global / tile max / min / mean
    (the softmax and the tile reductions already done)."""
    single_pos_pro = torch.max(g * label_vec, dim=1)[0]
    eta = torch.minimum(single_pos_pro, torch.tensor(P["eta"])).unsqueeze(1).repeat(
        1, P["num_classes"])
    gamma = torch.where(tmax > eta, torch.tensor(1), torch.tensor(0))
    sim_final = 1 / 2 * (g + (tmax * gamma + tmin * (1 - gamma)))
    sim = 1 / 2 * (g + tmean)
    values, indices = torch.topk(sim_final, k=P["top_k"], dim=1)
    pseudo = torch.zeros_like(sim_final, dtype=torch.int)
    pseudo.scatter_(1, indices, (values >= P["threshold"]).int())
    num_negatives = int(P["negative_ratio"] * P["num_classes"])
    if num_negatives > 0:
        _, neg_indices = torch.topk(sim, k=num_negatives, largest=False, dim=1)
        pseudo.scatter_(-1, neg_indices, torch.zeros_like(neg_indices, dtype=torch.int))
    return pseudo


def _neg_log(x, eps):
    return -torch.log(x + eps)


def _aevlp_gpr_loss(logits, pseudo_labels, label_vec, K, V, Q, P):
    """losses.GPR_loss (use_pl True), with its in-place V clamps."""
    preds = torch.sigmoid(logits)
    q2, q3 = Q
    loss_mtx = torch.zeros_like(preds)
    final = torch.where(label_vec == 0, pseudo_labels, label_vec)
    loss_mtx[label_vec == 1] = _neg_log(preds[label_vec == 1], 1e-7)
    m = final == 0
    loss_mtx[m] = V[m] * (K[m] * (1 - preds[m] ** q2) / q2
                          + (1 - K[m]) * (1 - (1 - preds[m]) ** q3) / q3)
    pos = (label_vec == 0) & (pseudo_labels == 1)
    V = V.clone()
    lam1, lam2 = (torch.tensor(1 - P[k], dtype=V.dtype) for k in ("lam_1", "lam_2"))
    V[pos] = torch.where(V[pos] > 1 - P["lam_1"], V[pos], lam1)
    V[pos] = torch.where(V[pos] < 1 - P["lam_2"], V[pos], lam2)
    loss_mtx[pos] = (1 - V[pos]) * (P["rho"] * _neg_log(preds[pos], 1e-7)
                                    + (1 - P["rho"]) * _neg_log(1 - preds[pos], 1e-7))
    loss_mtx[final == -1] = V[final == -1] * _neg_log(1 - preds[final == -1], 1e-7)
    reg = (preds.sum(1).mean(0) - P["expected_num_pos"]) ** 2 / P["num_classes"] ** 2
    return loss_mtx.mean() + P["reg"] * reg


def _single_positives(n, c, gen):
    y = torch.zeros(n, c, dtype=torch.int8)
    y[torch.arange(n), torch.randint(0, c, (n,), generator=gen)] = 1
    return y


@pytest.mark.parametrize(("c", "ratio", "top_k", "epoch"), [
    (100, 0.29, 40, 0), (100, 0.53, 60, 2), (20, 0.3, 10, 1), (12, 0.9, 12, 3)])
def test_gpr_released_is_the_released_code(c, ratio, top_k, epoch):
    """Values and gradients equal the released pseudo-labels, loss and train.py schedule, with
    neg_ratio's count differing from float32's floor (0.29, 0.53 at C = 100) and top-k that
    overlaps the lowest ranks (the released code drops those positives)."""
    gen = torch.Generator().manual_seed(c + epoch)
    n, n_epochs = 16, 4
    y = _single_positives(n, c, gen)
    g = torch.softmax(torch.randn(n, c, generator=gen, dtype=torch.float64) * 3, -1).float()
    tmax = g + torch.rand(n, c, generator=gen) * 0.3
    tmin = g * torch.rand(n, c, generator=gen)
    tmean = (tmax + tmin) / 2
    P = {"eta": 0.3, "num_classes": c, "top_k": top_k, "threshold": 0.005,
         "negative_ratio": ratio, "lam_1": 0.8, "lam_2": 0.2, "rho": 0.9, "reg": 0.01,
         "expected_num_pos": 2.9, "beta": [0, 10, -2, -8], "alpha": [0.5, 2, 0.8, 0.5],
         "q2q3": [0.01, 1.5]}
    pseudo = _aevlp_pseudo_labels(g, tmax, tmin, tmean, y.int(), P)
    lowest = int(ratio * c)
    assert lowest != int(torch.floor(torch.tensor(ratio) * c)) or c != 100  # the edge case
    e1 = epoch + 1  # train.py counts epochs from 1
    w0, wT, b0, bT = P["beta"]
    mu0, s0, muT, sT = P["alpha"]
    w = w0 + (wT - w0) * max(e1 - 1, 0) / n_epochs
    b = b0 + (bT - b0) * max(e1 - 1, 0) / n_epochs
    mu = mu0 + (muT - mu0) * e1 / n_epochs
    sigma = s0 + (sT - s0) * e1 / n_epochs
    z = (torch.randn(n, c, generator=gen, dtype=torch.float64) * 3).requires_grad_(True)
    p = torch.sigmoid(z.detach())
    K, V = 1 / (1 + torch.exp(-(w * p + b))), torch.exp(-0.5 * ((p - mu) / sigma) ** 2)
    ref = _aevlp_gpr_loss(z, pseudo, y.double(), K, V, P["q2q3"], P)
    (ref_grad,) = torch.autograd.grad(ref, z)

    loss = create_loss("gpr", released=True, w_0=w0, w_T=wT, b_0=b0, b_T=bT, mu_0=mu0,
                       sigma_0=s0, mu_T=muT, sigma_T=sT, q2=0.01, q3=1.5, lam1=0.8, lam2=0.2,
                       rho=0.9, reg=0.01, k=2.9, eta=0.3, top_k=float(top_k), threshold=0.005,
                       neg_ratio=ratio)
    loss.setup(y, n_epochs=n_epochs)
    loss.set_prior(g, {"tile_max": tmax, "tile_min": tmin, "tile_mean": tmean})
    loss.start_epoch(epoch)
    zz = z.detach().clone().requires_grad_(True)
    got = loss(zz, y, index=torch.arange(n)).loss
    got.backward()
    torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(zz.grad, ref_grad, rtol=1e-9, atol=1e-12)
    # the paper's rule (the default) differs on these inputs: it keeps the dropped positives
    paper = create_loss("gpr", **{**loss.hparams_dict(), "released": False,
                                  "pseudo_negatives": False})
    paper.setup(y, n_epochs=n_epochs)
    paper.set_prior(g, {"tile_max": tmax, "tile_min": tmin, "tile_mean": tmean})
    pos, _ = sys.modules["probe.losses.gpr"].gpr_pseudo_labels(
        paper.prior_damp, y, top_k, 0.005, (g + tmean) / 2, ratio)
    kept = (pos & (pseudo == 0)).any()  # positives the released code drops
    if top_k + int(ratio * c) > c:  # top-k and the lowest must overlap
        assert kept


def _vlpl_released(z, y, sim, P):
    """models.py's pseudo-labels (option 3) and losses.loss_EM_PL with its beta_neg term
    commented out, the loss matrix averaged as the caller does."""
    logits_pl = torch.zeros_like(sim)
    logits_pl = torch.where(sim > P["threshold"], torch.tensor(1.0, dtype=sim.dtype), logits_pl)
    num = int(P["partial"] * P["num_classes"])
    _, smallest = torch.topk(sim, num, largest=False)
    logits_pl.scatter_(1, smallest, torch.full(smallest.shape, -1, dtype=logits_pl.dtype))
    preds = torch.sigmoid(z)
    final = torch.where(y == 0, logits_pl, y)
    loss_mtx = torch.zeros_like(preds)
    loss_mtx[y == 1] = _neg_log(preds[y == 1], 1e-5)
    m = final == 0
    loss_mtx[m] = -P["alpha"] * (preds[m] * _neg_log(preds[m], 1e-5)
                                 + (1 - preds[m]) * _neg_log(1 - preds[m], 1e-5))
    pos = (y == 0) & (logits_pl == 1)
    loss_mtx[pos] = P["beta_pos"] * (0.9 * _neg_log(preds[pos], 1e-5)
                                     + 0.1 * _neg_log(1 - preds[pos], 1e-5))
    return loss_mtx.mean()


@pytest.mark.parametrize("partial", [0.0, 0.3, 0.9, 1.0])
def test_vlpl_released_is_the_released_code(partial):
    """k_neg = int(partial·C) up to C (≥ C − 2 included): the released scatter_ turns a
    pseudo-positive among the lowest into a negative, which the paper's rule keeps."""
    gen = torch.Generator().manual_seed(7)
    n, c = 12, 10
    y = _single_positives(n, c, gen).double()
    sim = torch.softmax(torch.randn(n, c, generator=gen, dtype=torch.float64), -1)
    P = {"threshold": 0.05, "partial": partial, "num_classes": c, "alpha": 0.1,
         "beta_pos": 0.7}
    z = (torch.randn(n, c, generator=gen, dtype=torch.float64) * 2).requires_grad_(True)
    ref = _vlpl_released(z, y, sim, P)
    (ref_grad,) = torch.autograd.grad(ref, z)
    loss = create_loss("vlpl", released=True, threshold=0.05, alpha=0.1, beta_pos=0.7,
                       k_neg=float(int(partial * c)))
    loss.setup(y, n_epochs=2)
    loss.set_prior(sim.float().double())
    zz = z.detach().clone().requires_grad_(True)
    got = loss(zz, y, index=torch.arange(n)).loss
    got.backward()
    torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(zz.grad, ref_grad, rtol=1e-9, atol=1e-12)
    paper = create_loss("vlpl", log_eps=1e-5, threshold=0.05, alpha=0.1, beta_pos=0.7,
                        k_neg=float(int(partial * c)))
    paper.setup(y, n_epochs=2)
    paper.set_prior(sim.float().double())
    differs = not torch.allclose(paper(z.detach(), y, index=torch.arange(n)).loss, ref.detach())
    k = int(partial * c)
    lowest = torch.zeros(n, c, dtype=torch.bool)
    lowest.scatter_(1, torch.topk(sim, k, largest=False).indices, True)
    overlap = ((sim > 0.05) & lowest & (y == 0)).any()
    assert differs == bool(overlap)  # only where a pseudo-positive falls among the lowest
    if partial >= 0.9:
        assert overlap
