"""Priors in the store (probe.store.priors, spml import priors) and the losses that read one
(VLPL, GPR with DAMP): each loss against a reference written from its formula, entry by entry;
the pseudo-labelling rules on crafted scores; stacked trials with a prior against a plain loop;
refusals (store bytes unchanged); the CLI end to end on the yeast store."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures_datasets import tree_digest
from torch import nn

import probe.losses as L
from probe import ProbeConfig, ProbeConfigError, SpeedOptions, train_probe
from probe.engine.data import ProbeData
from probe.errors import SpmlError
from probe.losses import LossInputError, create_loss
from probe.losses.gpr import damp_scores, gpr_pseudo_labels
from probe.losses.vlpl import vlpl_pseudo_labels
from probe.store import Prior, PriorError, open_store, verify_store, write_prior
from studies.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------- store


@pytest.fixture
def store(yeast_store, tmp_path) -> Path:
    """A private copy of the yeast store (2,417 rows, 14 classes) to write priors into."""
    path = tmp_path / "y.zarr"
    shutil.copytree(yeast_store, path)
    return path


def _scores(n: int, c: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).dirichlet(np.full(c, 0.3), n).astype(np.float32)



def test_write_read_list_and_verify_a_prior(store):
    s = open_store(store)
    scores = _scores(s.n_rows, s.n_classes)
    tile_max = scores + 0.1
    prov = {"model": "clip-test", "temperature": 0.01, "tiles": [4, 4], "prompt_template": "{}"}
    write_prior(store, "clip", scores, prov, extras={"tile_max": tile_max},
                class_names=s.class_names)
    s = open_store(store)
    assert s.prior_names() == ["clip"]
    got = s.prior("clip")
    assert got.scores.dtype == np.float32 and np.array_equal(got.scores, scores)
    assert np.array_equal(got.extras["tile_max"], tile_max)
    assert got.provenance["model"] == "clip-test" and got.provenance["source"] is None
    rows = s.split("train")[::7]
    part = s.prior("clip", rows=rows)
    assert np.array_equal(part.scores, scores[rows])
    assert np.array_equal(part.extras["tile_max"], tile_max[rows])
    summary = s.summary()
    assert summary["priors"]["clip"]["extras"] == ["tile_max"]
    assert "priors" not in summary["other_attrs"]
    report = verify_store(store)
    assert not report.damaged and "priors/clip/scores" in report.arrays
    assert report.arrays["priors/clip/scores"]["checksum"]
    # overwrite replaces it (and drops the old extras)
    write_prior(store, "clip", scores * 0.5, prov, overwrite=True)
    again = open_store(store).prior("clip")
    assert np.array_equal(again.scores, scores * 0.5) and again.extras == {}


@pytest.mark.parametrize(("change", "match"), [
    (lambda a: a[:-1], r"shape \(N, C\) = \(2417, 14\).*got \(2416, 14\)"),
    (lambda a: a[:, :-1], r"got \(2417, 13\)"),
    (lambda a: np.where(np.arange(a.size).reshape(a.shape) == 20, np.nan, a), r"nan/inf.*row 1, "
     r"class 6"),
    (lambda a: a.astype(np.float64) * 1e300, "overflow float32"),
    (lambda a: a.astype(str), "must hold numbers"),
])
def test_a_bad_prior_is_refused_and_the_store_untouched(store, change, match):
    s = open_store(store)
    before = tree_digest(store)
    with pytest.raises(PriorError, match=match):
        write_prior(store, "clip", change(_scores(s.n_rows, s.n_classes)), {})
    assert tree_digest(store) == before


def test_other_refusals_name_the_problem(store, tmp_path):
    s = open_store(store)
    scores = _scores(s.n_rows, s.n_classes)
    before = tree_digest(store)
    with pytest.raises(PriorError, match="another order"):
        write_prior(store, "clip", scores, {}, class_names=s.class_names[::-1])
    with pytest.raises(PriorError, match="other classes"):
        write_prior(store, "clip", scores, {}, class_names=[f"x{i}" for i in range(14)])
    with pytest.raises(PriorError, match="letters, digits"):
        write_prior(store, "../evil", scores, {})
    with pytest.raises(PriorError, match="extra 'tile_max'"):
        write_prior(store, "clip", scores, {}, extras={"tile_max": scores[:5]})
    with pytest.raises(PriorError, match="JSON"):
        write_prior(store, "clip", scores, {"model": object()})
    assert tree_digest(store) == before
    with pytest.raises(SpmlError, match=r"not found|does not exist|no store"):
        write_prior(tmp_path / "nowhere.zarr", "clip", scores, {})
    write_prior(store, "clip", scores, {})
    middle = tree_digest(store)
    with pytest.raises(PriorError, match=r"already holds prior 'clip'.*--overwrite"):
        write_prior(store, "clip", scores, {})
    assert tree_digest(store) == middle
    with pytest.raises(PriorError, match=r"no prior 'clap' \(it holds clip\)"):
        open_store(store).prior("clap")


def test_import_from_csv_and_parquet_matches_the_npy(store, tmp_path):
    import polars as pl

    from featurize.priors.files import import_priors

    s = open_store(store)
    scores = _scores(s.n_rows, s.n_classes, seed=3)
    np.save(tmp_path / "s.npy", scores)
    order = np.random.default_rng(1).permutation(s.n_rows)  # rows and columns shuffled
    cols = list(reversed(s.class_names))
    table = {"image_id": [s.image_ids[i] for i in order],
             **{c: scores[order, s.class_names.index(c)].tolist() for c in cols}}
    pl.DataFrame(table).write_parquet(tmp_path / "s.parquet")
    with open(tmp_path / "s.csv", "w", newline="") as fh:  # repr: every float32 digit
        csv.writer(fh).writerows([list(table), *zip(*table.values())])
    for name, suffix in (("a", "npy"), ("b", "parquet"), ("c", "csv")):
        import_priors(store, name, tmp_path / f"s.{suffix}", provenance={"model": "m"})
    got = open_store(store)
    for name in "abc":
        np.testing.assert_array_equal(got.prior(name).scores, scores)
    assert got.prior("b").provenance["source_files"]["scores"]["sha256"]
    before = tree_digest(store)
    pl.DataFrame({k: v[:-1] for k, v in table.items()}).write_csv(tmp_path / "short.csv")
    with pytest.raises(SpmlError, match="every store image id once"):
        import_priors(store, "d", tmp_path / "short.csv")
    pl.DataFrame({k: v for k, v in table.items() if k != cols[0]}).write_csv(tmp_path / "m.csv")
    with pytest.raises(SpmlError, match=f"missing {cols[0]}$"):
        import_priors(store, "d", tmp_path / "m.csv")
    assert tree_digest(store) == before


# ----------------------------------------------------------------------------- references


def _sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def vlpl_reference(z, y, s, alpha, beta_pos, beta_neg, threshold, k_neg, eps):
    """VLPL's loss_EM_PL written entry by entry from the formula (Python floats)."""
    b, c = len(z), len(z[0])
    total = 0.0
    for i in range(b):
        bottom = set(sorted(range(c), key=lambda j: (s[i][j], j))[:k_neg])
        for j in range(c):
            p = _sig(z[i][j])
            lp, ln = -math.log(p + eps), -math.log(1 - p + eps)
            if y[i][j] == 1:
                e = lp
            elif y[i][j] == -1:
                e = ln
            elif s[i][j] > threshold:
                e = beta_pos * (0.9 * lp + 0.1 * ln)
            elif j in bottom:
                e = beta_neg * (0.1 * lp + 0.9 * ln)
            else:
                e = -alpha * -(p * math.log(p + eps) + (1 - p) * math.log(1 - p + eps))
            total += e
    return total / (b * c)


def gpr_reference(z, y, s, ns, *, w, b, mu, sigma, q2, q3, lam1, lam2, rho, reg, k, top_k,
                  threshold, neg_ratio, pseudo_negatives):
    """GPR written entry by entry from the formula (Python floats)."""
    n, c = len(z), len(z[0])
    total, count = 0.0, 0.0
    for i in range(n):
        top = set(sorted(range(c), key=lambda j: (-s[i][j], j))[:top_k])
        low = set(sorted(range(c), key=lambda j: (ns[i][j], j))[:math.floor(neg_ratio * c)])
        for j in range(c):
            p = _sig(z[i][j])
            count += p
            kh = _sig(w * p + b)
            v = math.exp(-(p - mu) ** 2 / (2 * sigma**2))
            l2 = (1 - p**q2) / q2
            l3 = (1 - (1 - p) ** q3) / q3
            if y[i][j] == 1:
                e = -math.log(p)
            elif y[i][j] == -1:
                e = l3
            elif j in top and s[i][j] >= threshold:
                wt = max(min(1 - v, lam1), lam2)
                e = wt * (rho * -math.log(p) + (1 - rho) * -math.log(1 - p))
            elif pseudo_negatives and j in low:
                e = v * -math.log(1 - p)
            else:
                e = v * (kh * l2 + (1 - kh) * l3)
            total += e
    return total / (n * c) + reg * (count / n - k) ** 2 / c**2


# rows: every branch -- observed positive, observed negative, pseudo-positive (above θ), a
# bottom-k pseudo-negative, plain unknowns, tied scores, a row without a positive
Y = [[1, 0, 0, 0, -1], [0, 1, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 1, 0, 0]]
S = [[0.50, 0.40, 0.05, 0.04, 0.01], [0.10, 0.60, 0.20, 0.05, 0.05],
     [0.31, 0.30, 0.29, 0.05, 0.05], [0.02, 0.08, 0.70, 0.10, 0.10]]
Z = [[1.5, -0.3, 0.8, -2.0, 0.4], [-1.0, 2.2, 0.1, -0.7, 1.1], [0.3, -0.2, 0.9, -1.4, 2.5],
     [-2.5, 0.6, -0.4, 1.7, -0.9]]


@pytest.mark.parametrize(("k_neg", "beta_neg", "eps", "threshold"), [
    (0, 0.0, 0.0, 0.3), (2, 0.4, 0.0, 0.3), (2, 0.4, 1e-5, 0.25), (1, 0.2, 0.0, 0.9)])
def test_vlpl_equals_its_formula_entry_by_entry(k_neg, beta_neg, eps, threshold):
    z, y, s = torch.tensor(Z, dtype=torch.float64), torch.tensor(Y, dtype=torch.int8), \
        torch.tensor(S, dtype=torch.float64)
    got = L.vlpl(z, y, s, alpha=0.2, beta_pos=0.7, beta_neg=beta_neg, threshold=threshold,
                 k_neg=k_neg, log_eps=eps)
    want = vlpl_reference(Z, Y, S, 0.2, 0.7, beta_neg, threshold, k_neg, eps)
    assert float(got) == pytest.approx(want, rel=1e-12)


def test_vlpl_pseudo_labels_on_crafted_scores():
    y, s = torch.tensor(Y, dtype=torch.int8), torch.tensor(S)
    pos, neg = vlpl_pseudo_labels(s, y, 0.3, k_neg=2)
    assert pos.nonzero().tolist() == [[0, 1], [2, 0]]  # 0.40 and 0.31 > 0.3; 0.60 is observed
    # the two lowest per row (ties: lower class first), never observed, never positive
    assert neg.nonzero().tolist() == [[0, 3], [1, 3], [1, 4], [2, 3], [2, 4], [3, 0], [3, 1]]
    per_trial, _ = vlpl_pseudo_labels(s, y, torch.tensor([0.3, 0.2]))
    assert per_trial.shape == (2, 4, 5) and per_trial[1].sum() > per_trial[0].sum()


def test_vlpl_warmup_is_plain_em_then_pseudo_labels():
    y = torch.tensor(Y, dtype=torch.int8)
    loss = create_loss("vlpl", alpha=0.2, warmup_epochs=1)
    loss.setup(y, n_epochs=2)
    loss.set_prior(torch.tensor(S))
    z, index = torch.tensor(Z), torch.arange(4)
    loss.start_epoch(0)
    torch.testing.assert_close(loss(z, y, index=index).loss, L.em(z, y, alpha=0.2))
    loss.start_epoch(1)
    torch.testing.assert_close(loss(z, y, index=index).loss,
                               L.vlpl(z, y, torch.tensor(S), alpha=0.2))


def test_damp_scores_on_crafted_tiles():
    g = torch.tensor([[0.60, 0.20, 0.10, 0.05], [0.20, 0.50, 0.10, 0.05],
                      [0.30, 0.30, 0.20, 0.20]])
    tmax = torch.tensor([[0.70, 0.50, 0.10, 0.25], [0.10, 0.90, 0.25, 0.15],
                         [0.40, 0.01, 0.30, 0.20]])
    tmin = torch.tensor([[0.30, 0.10, 0.02, 0.01], [0.05, 0.20, 0.03, 0.01],
                         [0.10, 0.00, 0.10, 0.10]])
    y = torch.tensor([[1, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.int8)
    s = damp_scores(g, tmax, tmin, y, eta=0.3)
    # row 0: gate min(0.60, 0.3) = 0.3; row 1: min(0.20, 0.3) = 0.2; row 2 (no positive): 0
    want = [[(0.60 + 0.70) / 2, (0.20 + 0.50) / 2, (0.10 + 0.02) / 2, (0.05 + 0.01) / 2],
            [(0.20 + 0.05) / 2, (0.50 + 0.90) / 2, (0.10 + 0.25) / 2, (0.05 + 0.01) / 2],
            [(0.30 + 0.40) / 2, (0.30 + 0.01) / 2, (0.20 + 0.30) / 2, (0.20 + 0.20) / 2]]
    torch.testing.assert_close(s, torch.tensor(want))
    stacked = damp_scores(g, tmax, tmin, y, eta=torch.tensor([0.3, 0.05]))
    assert stacked.shape == (2, 3, 4)
    torch.testing.assert_close(stacked[0], s)
    # η = 0.05: row 0's class 2 tile max 0.10 now beats the gate
    assert float(stacked[1, 0, 2]) == pytest.approx((0.10 + 0.10) / 2)


def test_gpr_top_k_and_threshold_rule_on_crafted_scores():
    s = torch.tensor([[0.90, 0.60, 0.55, 0.50, 0.10], [0.50, 0.50, 0.50, 0.50, 0.10],
                      [0.40, 0.45, 0.30, 0.20, 0.10]])
    y = torch.tensor([[1, 0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 1, 0, 0, 0]], dtype=torch.int8)
    pos, neg = gpr_pseudo_labels(s, y, top_k=3, threshold=0.5, neg_ratio=0.4)
    # row 0: the top 3 are 0 (observed), 1, 2; class 3 reaches θ but is 4th; row 1: ties, the
    # lower classes first; row 2: nothing reaches θ
    assert pos.nonzero().tolist() == [[0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    # the ⌊0.4·5⌋ = 2 lowest of each row, less the positives and the observed: row 1's second
    # lowest is class 0 (ties: the lower class first), a pseudo-positive
    assert neg.nonzero().tolist() == [[0, 3], [0, 4], [1, 4], [2, 3], [2, 4]]


@pytest.mark.parametrize("pseudo_negatives", [True, False])
@pytest.mark.parametrize("top_k", [1, 3])
def test_gpr_equals_its_formula_entry_by_entry(pseudo_negatives, top_k):
    z, y, s = torch.tensor(Z, dtype=torch.float64), torch.tensor(Y, dtype=torch.int8), \
        torch.tensor(S, dtype=torch.float64)
    ns = torch.tensor(S, dtype=torch.float64).flip(-1)
    hp = {"w": 6.0, "b": -3.0, "mu": 0.6, "sigma": 0.4, "q2": 0.3, "q3": 1.2, "lam1": 0.7,
          "lam2": 0.55, "rho": 0.8, "reg": 0.05, "k": 1.7, "top_k": top_k, "threshold": 0.3,
          "neg_ratio": 0.4, "pseudo_negatives": pseudo_negatives}
    got = L.gpr(z, y, s, negative_scores=ns, **hp)
    want = gpr_reference(Z, Y, S, ns.tolist(), **hp)
    assert float(got) == pytest.approx(want, rel=1e-10)


def test_gpr_object_follows_the_gr_schedule_and_damp_from_tile_extras():
    y = torch.tensor(Y, dtype=torch.int8)
    g, tmax, tmin = torch.tensor(S), torch.tensor(S) + 0.2, torch.tensor(S) * 0.5
    loss = create_loss("gpr", k=1.5, top_k=2, threshold=0.2)
    loss.setup(y, n_epochs=3)
    loss.set_prior(g, {"tile_max": tmax, "tile_min": tmin})
    z, index = torch.tensor(Z), torch.arange(4)
    loss.start_epoch(1)  # halfway: (w, b, μ, σ) = (5, −5, 0.65, 1.25)
    s = damp_scores(g, tmax, tmin, y, eta=0.3)
    want = L.gpr(z, y, s, negative_scores=g, w=5.0, b=-5.0, mu=0.65, sigma=1.25, k=1.5,
                 top_k=2, threshold=0.2)
    torch.testing.assert_close(loss(z, y, index=index).loss, want)


def test_a_prior_loss_without_its_prior_says_so():
    y = torch.tensor(Y, dtype=torch.int8)
    for name in ("vlpl", "gpr"):
        loss = create_loss(name, **({"k": 1.5} if name == "gpr" else {}))
        loss.setup(y, n_epochs=1)
        with pytest.raises(LossInputError, match="--priors"):
            loss(torch.zeros(4, 5), y, index=torch.arange(4))
        with pytest.raises(LossInputError, match=r"\(N_train, C\) = \(4, 5\)"):
            loss.set_prior(torch.zeros(3, 5))
    an = create_loss("an")
    an.setup(y, n_epochs=1)
    with pytest.raises(LossInputError, match="uses no prior"):
        an.set_prior(torch.zeros(4, 5))


# ----------------------------------------------------------------------------- training

N_TRAIN, N_VAL, N_TEST, D, C = 40, 16, 16, 6, 5


def _data_with_prior(tiles: bool = True) -> ProbeData:
    """Toy data with a prior "t"; ``tiles``: with DAMP's tile extras (gpr reads them, vlpl
    refuses them by name)."""
    rng = np.random.default_rng(0)
    proto = rng.normal(size=(C, D))
    parts = {}
    for name, n in (("train", N_TRAIN), ("val", N_VAL), ("test", N_TEST)):
        y = np.zeros((n, C), dtype=np.uint8)
        for i in range(n):
            y[i, rng.choice(C, size=rng.integers(1, 4), replace=False)] = 1
        parts[name] = ((y @ proto + 0.5 * rng.normal(size=(n, D))).astype(np.float32), y)
    flip = (parts["train"][0] + 0.1 * rng.normal(size=(N_TRAIN, D))).astype(np.float32)
    data = ProbeData.from_arrays(parts["train"], parts["val"], parts["test"], train_flip=flip)
    noisy = parts["train"][1] * 0.5 + rng.random((N_TRAIN, C)) * 0.5  # a useful, noisy prior
    scores = (noisy / noisy.sum(1, keepdims=True)).astype(np.float32)
    extras = {"tile_max": scores + 0.1, "tile_min": scores * 0.3, "tile_mean": scores * 0.7}
    return dataclasses.replace(data, train_prior=Prior("t", scores, extras if tiles else {}))


def _plain_loop(data, name, hparams, seed, lr, epochs, batch) -> nn.Linear:
    """nn.Linear + torch.optim.Adam + the loss object given the prior once, (B, C) logits."""
    n, prior = data.n_train, data.train_prior
    x_plain, x_flip = data.train_x[:n, :-1], data.train_x[n:, :-1]
    torch.manual_seed(seed)
    head = nn.Linear(D, C)
    loss = create_loss(name, **hparams)
    loss.setup(data.train_observed, n_epochs=epochs)
    loss.set_prior(torch.from_numpy(prior.scores),
                   {k: torch.from_numpy(v) for k, v in prior.extras.items()})
    opt = torch.optim.Adam(head.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed + 2**32)
    for epoch in range(epochs):
        loss.start_epoch(epoch)
        perm = torch.randperm(n, generator=gen)
        coin = torch.randint(0, 2, (n,), generator=gen)
        for step in range(n // batch):
            idx = perm[step * batch:(step + 1) * batch]
            use = coin[step * batch:(step + 1) * batch].bool()[:, None]
            x = torch.where(use, x_flip[idx], x_plain[idx])
            out = loss(head(x.float()), data.train_observed[idx], index=idx)
            opt.zero_grad()
            out.loss.backward()
            opt.step()
    return head


@pytest.mark.parametrize(("name", "varied", "fixed"), [
    ("vlpl", ("threshold", [0.2, 0.3, 0.45]), {"alpha": 0.2, "k_neg": 1, "beta_neg": 0.3,
                                               "warmup_epochs": 1}),
    ("gpr", ("eta", [0.05, 0.3, 0.6]), {"k": 2.0, "top_k": 2, "threshold": 0.2}),
])
def test_stacked_trials_with_a_prior_equal_plain_loops(name, varied, fixed):
    data = _data_with_prior(tiles=name == "gpr")
    key, values = varied
    trials = [{**fixed, key: v, "lr": lr} for v, lr in zip(values, (1e-2, 3e-3, 2e-2))]
    cfg = ProbeConfig(epochs=3, batch_size=8, seed=4, use_presets=False, priors="t")
    result = train_probe(data, cfg, name, trials)
    assert result.shared_batch_order and result.n_trials == 3
    heads = []
    for t, trial in enumerate(trials):
        h = dict(trial)
        lr = h.pop("lr")
        ref = _plain_loop(data, name, h, seed=4, lr=lr, epochs=3, batch=8)
        got = result.head(t, best=False)
        torch.testing.assert_close(got.weight, ref.weight.detach(), atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(got.bias, ref.bias.detach(), atol=2e-5, rtol=1e-4)
        heads.append(got.weight)
    assert not torch.allclose(heads[0], heads[1])  # the varied parameter mattered
    mode = "DAMP (tile_max, tile_min)" if name == "gpr" else "scores only"
    assert f"{name} read prior 't': {mode}" in result.config["notes"]  # which mode ran


def test_per_trial_seeds_and_trial_blocks_each_get_the_prior():
    """One loss object per trial (per-trial seeds) and trials in blocks: every object is given
    the prior, and each trial still equals its plain loop."""
    data = _data_with_prior()
    trials = [{"k": 2.0, "top_k": 2, "eta": e} for e in (0.05, 0.3, 0.6)]
    per_seed = ProbeConfig(epochs=2, batch_size=8, lr=1e-2, seeds=(1, 2, 3), use_presets=False,
                           priors="t")
    result = train_probe(data, per_seed, "gpr", trials)
    assert not result.shared_batch_order
    for t, seed in enumerate((1, 2, 3)):
        ref = _plain_loop(data, "gpr", trials[t], seed=seed, lr=1e-2, epochs=2, batch=8)
        torch.testing.assert_close(result.head(t, best=False).weight, ref.weight.detach(),
                                   atol=2e-5, rtol=1e-4)
    shared = dataclasses.replace(per_seed, seeds=None, seed=4)
    data = _data_with_prior(tiles=False)
    one = train_probe(data, shared, "vlpl", [{"threshold": v} for v in (0.2, 0.3, 0.45)],
                      speed=SpeedOptions(trial_block=0))
    blocks = train_probe(data, shared, "vlpl", [{"threshold": v} for v in (0.2, 0.3, 0.45)],
                         speed=SpeedOptions(trial_block=1))
    assert blocks.timing["trial_blocks"] == [1, 1, 1]
    torch.testing.assert_close(blocks.final_heads, one.final_heads, atol=1e-6, rtol=1e-5)


def test_priors_are_refused_before_training_where_they_do_not_fit():
    data = _data_with_prior()
    bare = dataclasses.replace(data, train_prior=None)
    cfg = ProbeConfig(epochs=1, batch_size=8, use_presets=False)
    with pytest.raises(ProbeConfigError, match=r"vlpl needs a prior.*--priors NAME"):
        train_probe(data, cfg, "vlpl")
    with pytest.raises(ProbeConfigError, match=r"an uses no prior.*--priors t"):
        train_probe(data, dataclasses.replace(cfg, priors="t"), "an")
    with pytest.raises(ProbeConfigError, match="carries prior none"):
        train_probe(bare, dataclasses.replace(cfg, priors="t"), "gpr", {"k": 2.0})
    with pytest.raises(ProbeConfigError, match=r"carries prior 't'.*priors='u'"):
        train_probe(data, dataclasses.replace(cfg, priors="u"), "vlpl")


def test_a_teacher_prior_helps_on_yeast_and_an_unreachable_threshold_is_plain_em(store):
    """A prior that knows the labels a little (true labels + uniform noise, normalised) lifts
    VLPL above EM and GPR above GR on the real yeast set; a threshold above every score leaves
    VLPL EM (the same heads, to float rounding: the terms are computed by other ops)."""
    from probe import load_store

    s = open_store(store)
    labels = s.labels().astype(np.float32)
    noisy = labels + np.random.default_rng(0).random(labels.shape).astype(np.float32)
    write_prior(store, "teacher", noisy / noisy.sum(1, keepdims=True), {"model": "teacher"})
    data = load_store(store, device="cpu", priors="teacher")
    cfg = ProbeConfig(epochs=3, batch_size=32, lr=1e-3, priors="teacher")
    bare = dataclasses.replace(cfg, priors=None)

    def val(result):
        return result.trials[0].best["val_map"]

    em, gr = train_probe(data, bare, "em"), train_probe(data, bare, "gr")
    vlpl = train_probe(data, cfg, "vlpl", {"threshold": 0.1})
    gpr = train_probe(data, cfg, "gpr", {"threshold": 0.1})
    assert val(vlpl) > val(em) + 0.5, (val(vlpl), val(em))
    assert val(gpr) > val(gr) + 0.5, (val(gpr), val(gr))
    silent = train_probe(data, cfg, "vlpl", {"threshold": 1.0})
    torch.testing.assert_close(silent.final_heads, em.final_heads, atol=1e-6, rtol=1e-5)


# ----------------------------------------------------------------------------- CLI


def test_cli_import_probe_and_study_on_yeast(store, tmp_path, capsys):
    s = open_store(store)
    labels = s.labels().astype(np.float32)
    rng = np.random.default_rng(0)
    noisy = labels + rng.random(labels.shape).astype(np.float32)  # a teacher that knows a bit
    np.save(tmp_path / "scores.npy", noisy / noisy.sum(1, keepdims=True))
    assert main(["import", "priors", str(store), "--name", "teacher", "--from",
                 str(tmp_path / "scores.npy"), "--model", "test-teacher", "--temperature",
                 "0.01", "--tiles", "4x4"]) == 0
    assert "wrote prior 'teacher'" in capsys.readouterr().out
    assert main(["info", str(store)]) == 0
    assert "prior       teacher: model test-teacher, temperature 0.01" in capsys.readouterr().out
    for loss in ("vlpl", "gpr"):
        out = tmp_path / f"{loss}.json"
        assert main(["probe", str(store), "--loss", loss, "--priors", "teacher", "--epochs", "2",
                     "--batch-size", "32", "--lr", "1e-3", "--json", str(out), "--quiet"]) == 0
        run = json.loads(out.read_text())
        assert run["config"]["priors"] == "teacher"
        assert run["data"]["priors"]["name"] == "teacher"
        assert run["trials"][0]["best"]["val_map"] > 0
    capsys.readouterr()
    assert main(["probe", str(store), "--loss", "gpr", "--epochs", "1", "--quiet"]) == 2
    assert "--priors" in capsys.readouterr().err
    assert main(["probe", str(store), "--loss", "an", "--priors", "teacher", "--epochs", "1",
                 "--quiet"]) == 2
    assert "uses no prior" in capsys.readouterr().err
    assert main(["probe", str(store), "--loss", "vlpl", "--priors", "nope", "--epochs", "1",
                 "--quiet"]) == 2
    assert "no prior 'nope'" in capsys.readouterr().err
    assert main(["study", str(store), "--loss", "gpr", "--priors", "teacher", "--trials", "4",
                 "--epochs", "2", "--batch-size", "32", "--lr", "1e-3",
                 "--out", str(tmp_path / "study")]) == 0
    # confirm and refit re-train with the prior the study recorded (train + val rows for refit)
    assert main(["study", "confirm", "--storage", str(tmp_path / "study" / "study.log"),
                 "--store", str(store), "--top-k", "1", "--seeds", "0", "--out",
                 str(tmp_path / "study"), "--refit", "--device", "cpu"]) == 0
    assert "refit: trial" in capsys.readouterr().out
    # the prior is one of the study's training settings: another one would mix results
    (tmp_path / "other.npy").write_bytes((tmp_path / "scores.npy").read_bytes())
    assert main(["import", "priors", str(store), "--name", "other", "--from",
                 str(tmp_path / "other.npy")]) == 0
    capsys.readouterr()
    assert main(["study", str(store), "--loss", "gpr", "--priors", "other", "--trials", "6",
                 "--epochs", "2", "--batch-size", "32", "--lr", "1e-3",
                 "--out", str(tmp_path / "study")]) == 2
    assert "priors: the study has 'teacher', this command gives 'other'" in \
        capsys.readouterr().err
    assert main(["study", str(store), "--loss", "gpr", "--trials", "1", "--epochs", "1",
                 "--out", str(tmp_path / "bad")]) == 2
    assert "--priors" in capsys.readouterr().err


def test_the_fine_tune_refuses_a_prior_loss_by_name():
    from studies.finetune.run import FinetuneConfig, FinetuneError, build_loss

    with pytest.raises(FinetuneError, match=r"--loss vlpl reads a store prior.*spml probe"):
        build_loss(FinetuneConfig("voc", "unused", "vlpl", "unused"), {}, None)

