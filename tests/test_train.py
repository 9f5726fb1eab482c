"""The probe engine (probe.engine.train): exact semantics against a plain PyTorch loop, stacked
trials, stopping trials, determinism, results/heads files, real yeast data, and errors before
training.

The reference loop below is written from the documented semantics of probe.engine.train (not from
its code): ``torch.manual_seed(seed); nn.Linear(D, C)``; batch order from
``torch.Generator().manual_seed(seed + 2**32)`` -- per epoch ``randperm(N)`` then (flips on)
``randint(0, 2, (N,))``; consecutive batches, last partial one dropped; ``torch.optim`` on the
head (and on ``loss.extra_parameters()`` at lr × mult, no weight decay); the loss hooks.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

import probe.losses as L
from probe import (
    ProbeConfig,
    ProbeConfigError,
    SpeedOptions,
    SpmlError,
    evaluate_head,
    expand_grid,
    load_head,
    save_head,
    train_probe,
)
from probe.engine.data import DataError, ProbeData
from probe.engine.loop import init_head
from probe.losses import LossInputError, create_loss

N_TRAIN, N_VAL, N_TEST, D, C = 44, 20, 24, 6, 5


pytestmark = pytest.mark.usefixtures("one_thread")


def _arrays(seed: int = 0, flip: bool = True):
    """Small float16 features with a learnable signal; labels with 1-3 positives per row."""
    rng = np.random.default_rng(seed)
    proto = rng.normal(size=(C, D))
    out = {}
    for name, n in (("train", N_TRAIN), ("val", N_VAL), ("test", N_TEST)):
        y = np.zeros((n, C), dtype=np.uint8)
        for i in range(n):
            y[i, rng.choice(C, size=rng.integers(1, 4), replace=False)] = 1
        x = y @ proto + 0.5 * rng.normal(size=(n, D))
        out[name] = (x.astype(np.float16), y)
    flipped = (out["train"][0] + 0.1 * rng.normal(size=(N_TRAIN, D))).astype(np.float16)
    return out, (flipped if flip else None)


def _data(flip: bool = True, dataset: str = "arrays") -> ProbeData:
    arrays, flipped = _arrays(flip=flip)
    return ProbeData.from_arrays(arrays["train"], arrays["val"], arrays["test"],
                                 train_flip=flipped, dataset=dataset)


def _reference(data: ProbeData, loss_name: str, hparams: dict, seed: int, lr: float,
               epochs: int, batch: int, optimizer: str = "adam", weight_decay: float = 0.0,
               momentum: float = 0.9, flip: bool = True, drop_last: bool = True) -> nn.Linear:
    """The plain loop: nn.Linear + torch.optim + the loss object, one trial, (B, C) logits."""
    n = data.n_train
    x_plain = data.train_x[:n, :-1]
    x_flip = data.train_x[n:, :-1] if flip else None
    observed = data.train_observed
    torch.manual_seed(seed)
    head = nn.Linear(x_plain.shape[1], observed.shape[1])
    loss = create_loss(loss_name, **hparams)
    loss.setup(observed, n_epochs=epochs)
    loss.manual_seed([seed])
    groups = [{"params": list(head.parameters()), "weight_decay": weight_decay}]
    groups += [{"params": [p], "lr": lr * mult, "weight_decay": 0.0}
               for p, mult in loss.extra_parameters()]
    if optimizer == "adam":
        opt = torch.optim.Adam(groups, lr=lr)
    else:
        opt = torch.optim.SGD(groups, lr=lr, momentum=momentum)
    gen = torch.Generator().manual_seed(seed + 2**32)
    steps = n // batch if drop_last else math.ceil(n / batch)
    for epoch in range(epochs):
        loss.start_epoch(epoch)
        perm = torch.randperm(n, generator=gen)
        coin = torch.randint(0, 2, (n,), generator=gen) if flip else torch.zeros(n, dtype=int)
        for s in range(steps):
            idx = perm[s * batch : (s + 1) * batch]
            use_flip = coin[s * batch : (s + 1) * batch].bool()[:, None]
            x = x_plain[idx] if x_flip is None else torch.where(use_flip, x_flip[idx], x_plain[idx])
            out = loss(head(x.float()), observed[idx], index=idx)
            opt.zero_grad()
            out.loss.backward()
            opt.step()
        if loss.needs_epoch_pass:
            with torch.no_grad():
                loss.end_epoch(epoch, head(x_plain.float()).unsqueeze(0))
    return head


def _assert_head(result, trial: int, head: nn.Linear, best: bool = False, atol=2e-5):
    got = result.head(trial, best=best)
    torch.testing.assert_close(got.weight, head.weight.detach(), atol=atol, rtol=1e-4)
    torch.testing.assert_close(got.bias, head.bias.detach(), atol=atol, rtol=1e-4)


def test_init_head_is_nn_linear_default_init():
    for seed in (0, 7, 2**32 - 1):
        torch.manual_seed(seed)
        ref = nn.Linear(13, 4)
        w, b = init_head(seed, 13, 4)
        assert torch.equal(w, ref.weight.detach()) and torch.equal(b, ref.bias.detach())


# the stateless loss, GR with its schedule, and the stateful ones (ROLE: its own parameter at
# lr x 10; EM-APL: an end-of-epoch pass; LL-Cp: permanent flips in forward; OPML with soft
# targets and corrections: both, from the epoch pass)
EQUIV_LOSSES = [("an", {}), ("gr", {}), ("role", {"k": 2.0}), ("em_apl", {"warmup": 1}),
                ("ll_cp", {"delta_rel": 0.05}), ("opml", {"soft": True, "correct": True})]


@pytest.mark.parametrize(("loss_name", "hparams"), EQUIV_LOSSES)
def test_one_trial_equals_plain_pytorch_loop(loss_name, hparams):
    data = _data()
    cfg = ProbeConfig(epochs=3, batch_size=8, lr=1e-2, seed=3, use_presets=False)
    result = train_probe(data, cfg, loss_name, hparams)
    ref = _reference(data, loss_name, hparams, seed=3, lr=1e-2, epochs=3, batch=8)
    _assert_head(result, 0, ref)
    # the head moved: the comparison is not between two untouched initialisations
    w0, _ = init_head(3, D, C)
    assert (result.head(0, best=False).weight - w0).abs().max() > 1e-3


@pytest.mark.parametrize(("loss_name", "hparams"), EQUIV_LOSSES)
def test_each_stacked_trial_equals_its_plain_loop(loss_name, hparams):
    """T = 3 trials with different loss hyperparameters and learning rates (shared order)."""
    data = _data()
    cls = L.get_loss_class(loss_name)
    spec = next((s for s in cls.hparam_specs if s.stackable and s.search), None)
    trials = []
    for t in range(3):
        h = dict(hparams)
        if spec is not None:
            lo, hi = spec.search
            hi = min(hi, C - 1) if spec.name == "k" else hi  # k counts positives: at most C
            h[spec.name] = lo + (hi - lo) * (t + 1) / 4
        trials.append({**h, "lr": [1e-2, 3e-3, 2e-2][t]})
    cfg = ProbeConfig(epochs=2, batch_size=8, seed=5, use_presets=False)
    result = train_probe(data, cfg, loss_name, trials)
    assert result.shared_batch_order and result.n_trials == 3
    for t, h in enumerate(trials):
        h = dict(h)
        lr = h.pop("lr")
        ref = _reference(data, loss_name, h, seed=5, lr=lr, epochs=2, batch=8)
        _assert_head(result, t, ref)


@pytest.mark.parametrize(("loss_name", "hparams"), [("gr", {}), ("role", {"k": 2.0})])
def test_per_trial_seeds_give_per_trial_order_and_init(loss_name, hparams):
    data = _data()
    cfg = ProbeConfig(epochs=2, batch_size=8, lr=1e-2, seeds=(1, 2, 3), use_presets=False)
    result = train_probe(data, cfg, loss_name, hparams)
    assert not result.shared_batch_order
    for t, seed in enumerate((1, 2, 3)):
        _assert_head(result, t, _reference(data, loss_name, hparams, seed=seed, lr=1e-2,
                                           epochs=2, batch=8))


def test_sgd_weight_decay_no_flip_no_drop_last():
    data = _data(flip=False)
    cfg = ProbeConfig(epochs=2, batch_size=8, lr=5e-2, optimizer="sgd", momentum=0.8,
                      weight_decay=1e-2, drop_last=False, seed=4)
    result = train_probe(data, cfg, "an_ls", [{"eps": 0.1}, {"eps": 0.3, "weight_decay": 0.0}])
    for t, (eps, wd) in enumerate(((0.1, 1e-2), (0.3, 0.0))):
        ref = _reference(data, "an_ls", {"eps": eps}, seed=4, lr=5e-2, epochs=2, batch=8,
                         optimizer="sgd", momentum=0.8, weight_decay=wd, flip=False,
                         drop_last=False)
        _assert_head(result, t, ref)
    assert result.timing["steps_per_epoch"] == math.ceil(N_TRAIN / 8)


def test_best_epoch_selection_and_records():
    data = _data()
    cfg = ProbeConfig(epochs=4, batch_size=8, lr=3e-2, test_curve=True)
    result = train_probe(data, cfg, "an", [{}, {"lr": 1e-3}])
    for tr in result.trials:
        vals = [e["val_map"] for e in tr.epochs]
        # epochs count from 1 in every record
        assert [e["epoch"] for e in tr.epochs] == [1, 2, 3, 4]
        assert len(vals) == 4 and tr.best_epoch == int(np.argmax(vals)) + 1
        best = tr.epochs[tr.best_epoch - 1]
        assert tr.best["test_map"] == best["test_map"] and tr.best["val_map"] == max(vals)
        assert len(tr.best["test_ap"]) == C and np.mean(tr.best["test_ap"]) == pytest.approx(
            best["test_map"], rel=1e-5)
        assert {"val_OF1", "val_CF1", "test_OF1", "test_CF1", "train_loss"} <= set(best)
    # the best head is the one of the best epoch: its test mAP is re-measured from the head
    t = 0
    again = evaluate_head(data, result.head(t, best=True))
    assert again["test_map"] == pytest.approx(result.trials[t].best["test_map"], abs=1e-4)


def test_eval_every_and_observed_val_labels():
    data = _data()
    result = train_probe(data, ProbeConfig(epochs=5, batch_size=8, eval_every=2,
                                           val_labels="observed", test_curve=True), "an")
    evaluated = [e["epoch"] for e in result.trials[0].epochs if "val_map" in e]
    assert evaluated == [2, 4, 5]  # every second epoch, and the last (counted from 1)
    clean = train_probe(data, ProbeConfig(epochs=5, batch_size=8, eval_every=2,
                                          test_curve=True), "an")
    assert clean.trials[0].epochs[1]["val_map"] != result.trials[0].epochs[1]["val_map"]
    assert clean.trials[0].epochs[1]["test_map"] == result.trials[0].epochs[1]["test_map"]


@pytest.mark.parametrize("seeds", [None, (3, 4, 5)])
def test_test_once_on_the_best_head_reports_what_the_test_curve_reported(seeds):
    """Default evaluation (val every epoch, test once at the end on each best-val head) reports
    exactly the figures of the per-epoch test curve's best epoch, trial by trial -- also for a
    stopped trial, and with shared or per-trial batch orders."""
    data = _data()
    cfg = ProbeConfig(epochs=4, batch_size=8, lr=3e-2, seeds=seeds)
    trials = [{}, {"lr": 1e-3}, {"lr": 0.3}]

    def stop_1(report):
        return [1] if report.epoch == 1 else []

    once = train_probe(data, cfg, "an", trials, callback=stop_1)
    curve = train_probe(data, replace(cfg, test_curve=True), "an", trials, callback=stop_1)
    assert torch.equal(once.best_heads, curve.best_heads)
    assert torch.equal(once.final_heads, curve.final_heads)
    for a, b in zip(once.trials, curve.trials, strict=True):
        assert a.best_epoch == b.best_epoch and a.stopped_at == b.stopped_at
        assert a.best == b.best  # every figure, per-class AP included, bit for bit
        assert {"test_map", "test_OF1", "test_CF1", "test_ap", "val_ap"} <= set(a.best)
        assert not any(k.startswith("test") for e in a.epochs for k in e)
        assert [e["val_map"] for e in a.epochs] == [e["val_map"] for e in b.epochs]
        assert all("test_map" in e for e in b.epochs)
        assert a.init == {} and b.init == {}  # nothing evaluated before training by default
    assert once.trials[1].stopped_at == 1
    assert once.timing["test_seconds"] > 0


def test_eval_init_measures_the_untrained_heads():
    data = _data()
    result = train_probe(data, ProbeConfig(epochs=1, batch_size=8, eval_init=True), "an")
    init = result.trials[0].init
    assert set(init) == {"val_map", "test_map"}
    weight, bias = init_head(0, D, C)
    lin = nn.Linear(D, C)
    with torch.no_grad():
        lin.weight.copy_(weight)
        lin.bias.copy_(bias)
    assert init["test_map"] == pytest.approx(evaluate_head(data, lin)["test_map"], abs=1e-4)
    with pytest.raises(ValueError, match="--test-curve"):
        ProbeConfig(test_curve=1).validate()


def test_stopped_trial_freezes_and_others_are_unaffected():
    data = _data()
    cfg = ProbeConfig(epochs=3, batch_size=8, lr=1e-2, seed=2)
    trials = [{"eps": 0.05}, {"eps": 0.2}, {"eps": 0.3}]
    seen = []

    def stop_trial_1(report):
        seen.append(report)
        return [1] if report.epoch == 1 else []

    stopped = train_probe(data, cfg, "an_ls", trials, callback=stop_trial_1)
    full = train_probe(data, cfg, "an_ls", trials)
    one_epoch = train_probe(data, ProbeConfig(epochs=3, batch_size=8, lr=1e-2, seed=2),
                            "an_ls", trials[1])
    tr = stopped.trials[1]
    assert tr.stopped_at == 1 and len(tr.epochs) == 1 and tr.best_epoch == 1
    assert seen[1].active == [True, False, True] and seen[1].val_map[1] is None
    # its weights froze after epoch 1: equal to the first epoch of an unstopped run
    assert tr.epochs[0] == one_epoch.trials[0].epochs[0]
    assert torch.equal(stopped.final_heads[1], stopped.best_heads[1])
    for t in (0, 2):  # updated as trial slices now, not whole tensors: equal to rounding
        torch.testing.assert_close(stopped.final_heads[t], full.final_heads[t])
        for a, b in zip(stopped.trials[t].epochs, full.trials[t].epochs, strict=True):
            assert a == pytest.approx(b, rel=1e-4)


def test_stopping_with_per_trial_loss_objects_freezes_only_that_trial():
    """Per-trial seeds: each trial has its own ROLE loss (its own Θ, trial axis 1)."""
    data = _data()
    cfg = ProbeConfig(epochs=2, batch_size=8, lr=1e-2, seeds=(1, 2, 3), use_presets=False)
    full = train_probe(data, cfg, "role", {"k": 2.0})
    stopped = train_probe(data, cfg, "role", {"k": 2.0}, callback=lambda r: [1])
    assert [t.stopped_at for t in stopped.trials] == [None, 1, None]
    for t in (0, 2):
        torch.testing.assert_close(stopped.final_heads[t], full.final_heads[t])
    assert not torch.allclose(stopped.final_heads[1], full.final_heads[1])


def test_all_trials_stopped_ends_training():
    data = _data()
    result = train_probe(data, ProbeConfig(epochs=6, batch_size=8), "an", [{}, {}],
                         callback=lambda r: [0, 1])
    assert result.timing["epochs_run"] == 1
    assert all(t.stopped_at == 1 for t in result.trials)


def test_same_seed_is_bit_for_bit_reproducible_and_seed_matters():
    data = _data()
    cfg = ProbeConfig(epochs=2, batch_size=8, lr=1e-2, seed=11)
    a = train_probe(data, cfg, "gr")
    b = train_probe(data, cfg, "gr")
    c = train_probe(data, ProbeConfig(epochs=2, batch_size=8, lr=1e-2, seed=12), "gr")
    assert torch.equal(a.final_heads, b.final_heads)
    assert a.trials[0].epochs == b.trials[0].epochs
    assert not torch.equal(a.final_heads, c.final_heads)


def test_results_json_and_head_round_trip(tmp_path):
    data = _data()
    result = train_probe(data, ProbeConfig(epochs=2, batch_size=8, seed=9), "gr",
                         [{"w_T": 2.0}, {"w_T": 10.0}])
    path = result.write_json(tmp_path / "out" / "run.json")
    payload = json.loads(path.read_text())
    assert [p.name for p in path.parent.iterdir()] == ["run.json"]  # no temp file left
    assert payload["loss"] == "gr" and payload["n_trials"] == 2
    assert payload["config"]["seed"] == 9 and payload["config"]["batch_size"] == 8
    assert payload["trials"][1]["hparams"]["w_T"] == 10.0
    assert payload["trials"][0]["best_epoch"] in (1, 2)
    assert [e["epoch"] for e in payload["trials"][0]["epochs"]] == [1, 2]
    assert len(payload["trials"][0]["epochs"]) == 2 and "environment" in payload
    assert payload["data"]["kind"] == "arrays"

    head_file = save_head(tmp_path / "heads.pt", result)
    lin, meta = load_head(head_file, trial=1)
    torch.testing.assert_close(lin.weight, result.head(1).weight)
    assert meta["loss"] == "gr" and meta["trials"][0]["hparams"]["w_T"] == 2.0
    with pytest.raises(ProbeConfigError, match="holds 2 heads"):
        load_head(head_file, trial=5)
    (tmp_path / "junk.pt").write_bytes(b"not a head")
    with pytest.raises(ProbeConfigError, match="not a readable"):
        load_head(tmp_path / "junk.pt")


def test_expand_grid_product_and_zip():
    assert expand_grid({"a": [1, 2], "b": [3]}) == [{"a": 1, "b": 3}, {"a": 2, "b": 3}]
    assert len(expand_grid({"a": [1, 2], "b": [3, 4, 5]})) == 6
    assert expand_grid({"a": [1, 2], "b": [3, 4]}, zip_=True) == [{"a": 1, "b": 3},
                                                                  {"a": 2, "b": 4}]
    with pytest.raises(ProbeConfigError, match="same length"):
        expand_grid({"a": [1, 2], "b": [3, 4, 5]}, zip_=True)


# ----------------------------------------------------------------------------- errors


def test_errors_before_training():
    data = _data()
    with pytest.raises(ProbeConfigError, match=r"batch size 45 .* larger than the train split"):
        train_probe(data, ProbeConfig(batch_size=45, epochs=1), "an")
    with pytest.raises(LossInputError, match="unknown hyperparameter 'w_t'; did you mean 'w_T'"):
        train_probe(data, ProbeConfig(epochs=1), "gr", {"w_t": 3.0})
    with pytest.raises(LossInputError, match="unknown loss"):
        train_probe(data, ProbeConfig(epochs=1), "nope")
    with pytest.raises(ProbeConfigError, match="'use_k' is a structural"):
        train_probe(data, ProbeConfig(epochs=1), "gr", [{"use_k": True}, {"use_k": False}])
    with pytest.raises(ProbeConfigError, match="--labels"):
        train_probe(data, ProbeConfig(labels="partial"), "an")
    with pytest.raises(ProbeConfigError, match="3 hyperparameter trials but 2 seeds"):
        train_probe(data, ProbeConfig(seeds=(1, 2)), "an", [{}, {}, {}])
    with pytest.raises(ProbeConfigError, match="'lr' must be a positive"):
        train_probe(data, ProbeConfig(epochs=1), "an", {"lr": -1.0})


def test_class_count_that_contradicts_the_loss_settings():
    coco_named = _data(dataset="coco")  # 5 classes, but the gr presets are COCO's 80
    with pytest.raises(ProbeConfigError, match="dataset 'coco' but has 5 classes"):
        train_probe(coco_named, ProbeConfig(epochs=1), "gr")
    with pytest.raises(ProbeConfigError, match=r"k=7 expected positives .* only 5 classes"):
        train_probe(_data(), ProbeConfig(epochs=1), "epr", {"k": 7.0})


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_gpu_requested_without_one():
    with pytest.raises(DataError, match="no usable CUDA GPU"):
        train_probe(_data(), ProbeConfig(device="cuda"), "an")


def test_store_without_val_split(tmp_path):
    from probe.store import write_feature_store
    from probe.store.index import DatasetIndex, Phase

    y = np.eye(3, dtype=np.uint8)
    pool = Phase(("a", "b"), (None, None), y[:2])  # 2 pool rows: round(0.2 * 2) = 0 val rows
    test = Phase(("c",), (None,), y[2:])
    index = DatasetIndex("tiny", ("x", "y", "z"), pool, test)
    store = write_feature_store(tmp_path / "s.zarr", index, np.ones((3, 4), np.float32),
                                provenance={"backbone": "none", "weights": "none",
                                            "transform": "none"}, progress=False)
    with pytest.raises(DataError, match="has no val rows"):
        ProbeData.from_store(store)


# ----------------------------------------------------------------------------- real data


@pytest.fixture(scope="module")
def yeast(yeast_store):
    return ProbeData.from_store(yeast_store)


def test_yeast_full_labels_beat_single_positive_an(yeast):
    cfg = ProbeConfig(epochs=3, batch_size=16, lr=1e-3)
    an = train_probe(yeast, cfg, "an")
    full = train_probe(yeast, ProbeConfig(epochs=3, batch_size=16, lr=1e-3, labels="full"), "an")
    assert full.trials[0].best["test_map"] > an.trials[0].best["test_map"] + 2
    again = train_probe(yeast, cfg, "an")
    assert again.trials[0].epochs == an.trials[0].epochs
    assert torch.equal(again.final_heads, an.final_heads)
    assert an.source["dataset"] == "yeast" and an.source["provenance"]["backbone"]


@pytest.mark.parametrize("name", L.available())
def test_every_registered_loss_trains_on_yeast(yeast, name):
    if L.get_loss_class(name).prior is not None:
        pytest.skip("reads a store prior: trained on yeast in tests/test_priors.py")
    result = train_probe(yeast, ProbeConfig(epochs=2, batch_size=32, lr=1e-3, eval_init=True),
                         name)
    tr = result.trials[0]
    assert tr.finite, f"{name}: non-finite loss or metric: {tr.epochs}"
    assert all(math.isfinite(e["train_loss"]) for e in tr.epochs)
    assert tr.best["val_map"] > tr.init["val_map"] + 1.0, (name, tr.init, tr.best)
    if any(s.name == "k" for s in L.get_loss_class(name).hparam_specs):
        # dataset-dependent k: yeast has no published value -> the val label cardinality
        assert tr.hparams["k"] == pytest.approx(yeast.val_label_cardinality(), rel=1e-5)


def test_paper_presets_train_the_head_at_the_released_codes_head_rate():
    """GR's Table 6 lr (1e-5) is the backbone's; its released code trains the linear head at
    lr_mult = 10 × that, and a probe trains only the head."""
    from probe import resolve_training
    from probe.losses import get_loss_class

    gr = resolve_training(get_loss_class("gr"), "coco").to_dict()
    assert gr["lr"] == pytest.approx(1e-4) and gr["batch_size"] == 16 and gr["epochs"] == 8
    assert "head rate: 10 × the backbone's 1e-05" in gr["lr_from"]
    em = resolve_training(get_loss_class("em_apl"), "coco").to_dict()
    assert em["lr"] == pytest.approx(1e-5)  # no head multiplier in its released code
    given = resolve_training(get_loss_class("gr"), "coco", lr=3e-3).to_dict()
    assert given["lr"] == 3e-3 and given["lr_from"] == "as given"


def _data_8_classes() -> ProbeData:
    rng = np.random.default_rng(5)
    out = []
    for n in (64, 24, 24):
        y = (rng.random((n, 8)) < 0.3).astype(np.uint8)
        y[np.arange(n), rng.integers(0, 8, n)] = 1
        out.append(((y @ rng.normal(size=(8, D)) + rng.normal(size=(n, D))).astype(np.float16), y))
    return ProbeData.from_arrays(*out)


@pytest.mark.parametrize("loss_name,trials,extra", [
    ("an", [{"lr": 1e-2}, {"lr": 3e-2}, {"lr": 1e-1}, {"lr": 1e-2}], {}),
    ("gr", [{"w_T": 2.0, "learn_kv": True}, {"w_T": 6.0, "learn_kv": True},
            {"w_T": 10.0, "learn_kv": True}], {}),
    ("role", [{"k": 2.0}, {"k": 3.0}, {"k": 1.5}], {"use_presets": False}),
    ("ll_cp", [{"delta_rel": 0.1}, {"delta_rel": 0.3}, {"delta_rel": 0.5}], {}),
    ("em_apl", [{"alpha": 0.1, "warmup": 1}, {"alpha": 0.2, "warmup": 1},
                {"alpha": 0.3, "warmup": 1}], {}),
    ("an", [{}, {"lr": 3e-2}, {"lr": 1e-1}], {"optimizer": "sgd", "seeds": (1, 2, 3)}),
    ("role", [{"k": 2.0}] * 3, {"seeds": (1, 2, 3), "use_presets": False}),
])
def test_stopped_trials_leave_the_stack_and_survivors_are_bit_identical(loss_name, trials, extra):
    """A stopped (pruned) trial leaves the stacked model -- heads, optimizer state, the loss's
    per-trial state -- and the trials that go on are bit for bit those of a run in which
    nothing was stopped: every epoch's figures, best and final heads."""
    data = _data_8_classes()
    # bit for bit: B·C = 64 (a whole number of CPU vectors) and one step thread (StackedTrainer.
    # stop's docstring says when the equality is exact; COCO's 16·80 step is such a block)
    cfg = ProbeConfig(epochs=4, batch_size=8, lr=1e-2, **extra)
    one_thread = SpeedOptions(step_threads=1)
    shapes = []

    def stop(report):
        shapes.append(report.heads.shape[0])
        return {1: [1], 3: [0]}.get(report.epoch, [])  # epochs count from 1

    full = train_probe(data, cfg, loss_name, trials, speed=one_thread)
    cut = train_probe(data, cfg, loss_name, trials, callback=stop, speed=one_thread)
    n = len(trials)
    assert shapes == [n, n - 1, n - 1, n - 2]  # the stack shrinks as trials stop
    assert [t.stopped_at for t in cut.trials] == [3, 1] + [None] * (n - 2)
    for t in range(2, n):
        a, b = cut.trials[t], full.trials[t]
        assert a.epochs == b.epochs and a.best == b.best and a.best_epoch == b.best_epoch
        assert torch.equal(cut.final_heads[t], full.final_heads[t])
        assert torch.equal(cut.best_heads[t], full.best_heads[t])
    for t, stopped_at in ((1, 1), (0, 3)):  # the stopped trials kept what they had
        assert cut.trials[t].epochs == full.trials[t].epochs[:stopped_at]
    one = train_probe(data, replace(cfg, epochs=4), loss_name, trials, callback=lambda r: (
        list(range(n)) if r.epoch == 1 else []), speed=one_thread)
    assert torch.equal(cut.final_heads[1], one.final_heads[1])  # its head as it left


BLOCK_CASES = [
    ("gr", [{"w_T": w, "learn_kv": True} for w in (2.0, 4.0, 6.0, 8.0, 10.0)], {}),
    ("role", [{"k": k} for k in (1.5, 2.0, 2.5, 3.0, 3.5)], {"use_presets": False}),
    ("em_apl", [{"alpha": a, "warmup": 1} for a in (0.1, 0.2, 0.3, 0.4, 0.5)], {}),
    ("ll_cp", [{"delta_rel": d} for d in (0.1, 0.2, 0.3, 0.4, 0.5)], {}),
    ("an", [{}, {"lr": 3e-2}, {"lr": 1e-1}, {}, {"lr": 3e-3}],
     {"optimizer": "sgd", "seeds": (1, 2, 3, 4, 5)}),
    ("opml", [{"alpha": a} for a in (0.5, 1.0, 1.5, 2.0, 2.5)], {}),  # cannot drop trials
]


@pytest.mark.parametrize("loss_name,trials,extra", BLOCK_CASES)
def test_trials_in_blocks_train_exactly_as_in_one_block(loss_name, trials, extra):
    """SpeedOptions.trial_block: blocks of 2 (2 + 2 + 1 trials, each block through the whole
    epoch before the next) give every trial's epochs, best and final heads bit for bit as one
    block does, also when trials stop (pruning) in the blocked run."""
    data = _data_8_classes()
    cfg = ProbeConfig(epochs=3, batch_size=8, lr=1e-2, **extra)  # B·C = 64
    one = train_probe(data, cfg, loss_name, trials,
                      speed=SpeedOptions(step_threads=1, trial_block=0))
    in_twos = SpeedOptions(step_threads=1, trial_block=2)
    blocked = train_probe(data, cfg, loss_name, trials, speed=in_twos)
    assert one.timing["trial_blocks"] == [5] and blocked.timing["trial_blocks"] == [2, 2, 1]
    for a, b in zip(blocked.trials, one.trials, strict=True):
        assert a.epochs == b.epochs and a.best == b.best and a.best_epoch == b.best_epoch
    assert torch.equal(blocked.final_heads, one.final_heads)
    assert torch.equal(blocked.best_heads, one.best_heads)
    shapes = []

    def stop(report):  # trial 1 (block 0) after epoch 1; trial 4 (the last block, alone) after 2
        shapes.append(report.heads.shape[0])
        return {1: [1], 2: [4]}.get(report.epoch, [])

    cut = train_probe(data, cfg, loss_name, trials, callback=stop, speed=in_twos)
    assert shapes == [5, 4, 3]
    survivors = (0, 2, 3)
    for t in survivors:
        assert cut.trials[t].epochs == one.trials[t].epochs
        close = torch.equal if L.get_loss_class(loss_name).trial_state is not None else (
            torch.allclose)  # a frozen trial still shares its block's tensors
        assert close(cut.final_heads[t], one.final_heads[t])
    assert cut.trials[4].epochs == one.trials[4].epochs[:2]


def test_trial_blocks_are_balanced_sized_to_the_cache_and_cpu_only():
    import probe.engine.loop as loop

    cpu = torch.device("cpu")
    sizes = lambda n, b, s: [len(r) for r in loop.trial_blocks(n, b, cpu, s)]  # noqa: E731
    assert sizes(64, 0, 8) == [8] * 8
    assert sizes(60, 0, 8) == [8] * 4 + [7] * 4
    assert sizes(9, 0, 8) == [5, 4] and sizes(5, 0, 8) == [5] and sizes(64, 0, 0) == [64]
    coco = 4 * 2049 * 80 * 4  # head, gradient, Adam's two moments (float32)
    assert sizes(64, coco, None) == [8] * 8  # 24 MiB hold 9 COCO heads: 8 blocks of 8
    assert sizes(64, 4 * 104 * 14 * 4, None) == [64]  # yeast's heads all fit
    assert [len(r) for r in loop.trial_blocks(64, coco, torch.device("meta"), 8)] == [64]
    data = _data()
    given = create_loss("gr", w_T=torch.tensor([2.0, 4.0]))  # the caller's object: not split
    cfg, ones = ProbeConfig(epochs=1, batch_size=8), SpeedOptions(trial_block=1)
    result = train_probe(data, cfg, given, speed=ones)
    assert result.timing["trial_blocks"] == [2]
    gr = [{"w_T": 2.0}, {"w_T": 4.0}]
    result = train_probe(data, cfg, "gr", gr, speed=ones)
    assert result.timing["trial_blocks"] == [1, 1]
    for bad in (-1, True, 1.5):
        with pytest.raises(SpmlError, match="--trial-block"):
            SpeedOptions(trial_block=bad).validate()


def test_a_loss_that_cannot_drop_trials_freezes_them_in_place():
    data = _data()
    cfg = ProbeConfig(epochs=3, batch_size=8, lr=1e-2)
    trials = [{"alpha": 1.0}, {"alpha": 2.0}, {"alpha": 0.5}]
    shapes = []

    def stop(report):
        shapes.append(report.heads.shape[0])
        return [1] if report.epoch == 1 else []

    full = train_probe(data, cfg, "opml", trials)
    cut = train_probe(data, cfg, "opml", trials, callback=stop)
    assert shapes == [3, 2, 2]  # the callback sees the active trials' heads either way
    assert torch.equal(cut.final_heads[1], cut.best_heads[1])
    for t in (0, 2):
        torch.testing.assert_close(cut.final_heads[t], full.final_heads[t])


def test_cuda_graph_is_refused_where_the_step_cannot_be_captured():
    data = _data()
    with pytest.raises(ValueError, match=r"--cuda-graph.*CUDA device"):
        train_probe(data, ProbeConfig(epochs=1, batch_size=8, cuda_graph=True), "an")
    with pytest.raises(ValueError, match="--cuda-graph"):
        ProbeConfig(cuda_graph="yes").validate()


@pytest.mark.gpu
@pytest.mark.parametrize("loss_name,trials", [
    ("an", [{"lr": 1e-2}, {"lr": 3e-2}]),
    ("gr", [{"w_T": 2.0}, {"w_T": 10.0}]),
    ("ll_cp", [{"delta_rel": 0.2}, {"delta_rel": 0.5}]),
])
@pytest.mark.parametrize("graph_steps,drop_last", [(1, True), (16, True), (3, False)])
def test_cuda_graph_step_equals_the_eager_step(loss_name, trials, graph_steps, drop_last,
                                               monkeypatch):
    """The captured steps replay the eager step's kernels: the same heads bit for bit, the
    same losses and metrics. 64 train rows: at batch 8, 3 eager warm-up steps then a one-step
    graph replayed 5 times (GRAPH_STEPS's default) or one graph of the 5 steps; at batch 7 with
    drop_last=False, 3 warm-up steps, three replays of a 3-step graph and an eager last step of
    one row."""
    from probe.engine import loop

    monkeypatch.setattr(loop, "GRAPH_STEPS", graph_steps)
    data = _data_8_classes()
    cfg = ProbeConfig(epochs=3, batch_size=8 if drop_last else 7, lr=1e-2, device="cuda",
                      drop_last=drop_last)
    eager = train_probe(data, replace(cfg, cuda_graph=False), loss_name, trials)
    graph = train_probe(data, replace(cfg, cuda_graph=True), loss_name, trials)
    assert graph.timing["cuda_graph"] and not eager.timing["cuda_graph"]
    assert torch.equal(graph.final_heads, eager.final_heads)
    for a, b in zip(graph.trials, eager.trials, strict=True):
        assert a.epochs == b.epochs
        assert a.best_epoch == b.best_epoch


def test_cuda_graphs_are_used_wherever_the_step_can_be_captured():
    """ProbeConfig.cuda_graph=None (the default): graphs on CUDA with fused Adam, the eager
    step elsewhere, without an error."""
    data = _data()
    result = train_probe(data, ProbeConfig(epochs=1, batch_size=8, optimizer="sgd"), "an")
    assert result.timing["cuda_graph"] is False  # CPU here, or SGD on a GPU


def test_a_heads_logits_do_not_depend_on_the_heads_evaluated_with_it():
    """A one-head product on several threads rounds unlike the same head in a batch (seen at
    4096 x 1025 x 80 on a 2-core CPU); evaluation runs it on one thread, so a trial's reported
    figures are the same whether it was evaluated alone or stacked."""
    from probe.evaluation.heads import stacked_logits

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 1025, generator=g).half()
    w = torch.randn(4, 1025, 80, generator=g)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        stacked = stacked_logits(x, w)
        for k in (0, 3):
            assert torch.equal(stacked_logits(x, w[k : k + 1])[0], stacked[k])
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_test_intervals_from_the_final_pass_equal_the_intervals_after_the_run(monkeypatch):
    """ProbeConfig.test_intervals bootstraps the logits of the final test pass, block by block
    (three blocks here), instead of a second pass after training: every trial's interval and
    the recorded settings equal attach_test_intervals' on the same run; with the test curve
    (no final pass) too."""
    from probe.evaluation import heads as evaluate
    from probe.evaluation.intervals import attach_test_intervals

    data = _data_8_classes()
    trials = [{"lr": 1e-2}, {"lr": 3e-2}, {"lr": 1e-1}, {"lr": 3e-1}, {"lr": 5e-2}]
    base = ProbeConfig(batch_size=16, epochs=3, use_presets=False)
    after = train_probe(data, base, "an", trials)
    attach_test_intervals(after, data, n_resamples=60)
    monkeypatch.setattr(evaluate, "EVAL_BLOCK", 2 * data.test_x.shape[0] * data.n_classes)
    for curve in (False, True):
        cfg = replace(base, test_intervals=60, test_curve=curve)
        during = train_probe(data, cfg, "an", trials)
        assert during.config["test_interval"] == after.config["test_interval"]
        assert during.config["test_intervals"] == 60
        for a, b in zip(during.trials, after.trials):
            assert a.best == b.best  # test figures and intervals, bit for bit
        assert all("test_map_low" in t.best for t in during.trials)
        assert 0 < during.timing["test_interval_seconds"]  # the share of the test pass's time
    assert after.timing["test_interval_seconds"] == 0.0
    with pytest.raises(ProbeConfigError, match="--intervals"):
        replace(base, test_intervals=-1).validate()
