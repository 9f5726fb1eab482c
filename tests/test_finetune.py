"""``spml finetune`` (studies/finetune/run.py): end-to-end runs on a tiny real-format VOC fixture
with random weights on CPU, interrupt + resume equal to an uninterrupted run bit for bit, the
per-epoch loss pass, the CLI with a study winner file, and every bad input rejected before work.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from probe.losses import LossInputError, available, create_loss
from probe.store.protocol import single_positive, split_pool
from studies.cli.finetune import (
    config_from_args,
    format_summary,
    parse_assignments,
)
from studies.cli.finetune import (
    register_cli as register_finetune_cli,
)
from studies.finetune.run import (
    CHECKPOINT_NAME,
    FinetuneConfig,
    FinetuneError,
    FinetuneRun,
    finetune,
    read_winner_json,
)

sys.path.insert(0, str(Path(__file__).parent))
from fixtures_datasets import make_voc

# tiny and fast: 32x32 images, batch 2; where the test is about plumbing, MobileNetV3-small
# (2.5M parameters; its Dropout also draws from the global RNG, which resume must restore)
FAST = {"backbone": "mobilenet_v3_small", "weights": "random", "size": 32, "batch_size": 2,
        "save_best": False, "progress": False}
DETERMINISTIC = ("epoch", "steps", "global_step", "train_loss", "val_map", "val_n_empty_classes",
                 "val_f1", "test_map", "test_n_empty_classes", "test_f1", "train_images")


# one intra-op thread: on a shared 2-core machine, torch's thread pool waiting on busy cores
# makes these tiny convolutions ~10x slower
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def voc(tmp_path_factory) -> dict:
    """VOC 2012 layout, 10 + 4 listed images: 7 train / 2 val (pool) and 2-3 test kept."""
    root = tmp_path_factory.mktemp("voc")
    return make_voc(root, n_train=10, n_val=4, seed=0)


def _config(voc: dict, out: Path, loss: str, **kw) -> FinetuneConfig:
    return FinetuneConfig(dataset="voc", root=voc["root"], loss=loss, out=out, **{**FAST, **kw})


def _checkpoint(out: Path) -> dict:
    return torch.load(out / CHECKPOINT_NAME, map_location="cpu", weights_only=False)


def _same_tensors(a, b) -> bool:
    """Bitwise equality of nested dicts/lists of tensors and numbers."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and (
            torch.equal(a, b) or bool(torch.isnan(a).eq(torch.isnan(b)).all()
                                      and a.nan_to_num().eq(b.nan_to_num()).all()))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_tensors(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same_tensors(x, y) for x, y in zip(a, b))
    return a == b


# --------------------------------------------------------------------------------------------
# resume
# --------------------------------------------------------------------------------------------


def test_resume_after_crash_equals_uninterrupted_run(voc, tmp_path, monkeypatch):
    """ROLE (a trainable Θ in its own Adam group at lr x 10) for 2 epochs of 3 steps: a run that
    crashes at its first epoch end, resumes from its step checkpoint, is stopped by max_steps
    and resumed again ends bit-for-bit where one uninterrupted run ends."""
    whole = finetune(_config(voc, tmp_path / "whole", "role", epochs=2, save_best=True), {})
    assert whole.completed and whole.global_step == 6 and len(whole.epochs) == 2
    assert whole.train["source"] == {"batch_size": "as given",
                                     "lr": "generic (Cole et al. end-to-end fine-tune)",
                                     "epochs": "as given"}
    assert whole.hparams["k"] == 1.5  # Cole et al.'s VOC value via the preset
    assert whole.best_epoch in (1, 2)  # epochs count from 1
    assert [e["epoch"] for e in whole.epochs] == [1, 2]
    assert whole.test_map == whole.epochs[whole.best_epoch - 1]["test_map"]
    assert whole.best_val_map == max(e["val_map"] for e in whole.epochs)
    assert set(whole.test_ap) == set(voc["class_names"])
    assert whole.images_per_s["train"] > 0 and whole.images_per_s["eval"] > 0
    summary = format_summary(whole)
    assert f"best val epoch {whole.best_epoch}: val mAP {whole.best_val_map:.2f}" in summary
    assert "completed; results in" in summary and "images/s: train" in summary
    on_disk = json.loads((tmp_path / "whole" / "results.json").read_text())
    assert on_disk["test_map"] == whole.test_map and on_disk["completed"] is True
    best = torch.load(tmp_path / "whole" / "best_model.pt", weights_only=True)
    assert best["epoch"] == whole.best_epoch and "head.weight" in best["model"]

    out = tmp_path / "split"

    def crash(self):
        raise RuntimeError("simulated crash during evaluation")

    monkeypatch.setattr(FinetuneRun, "_end_epoch", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        finetune(_config(voc, out, "role", epochs=2, checkpoint_every=2), {})
    monkeypatch.undo()
    ckpt = _checkpoint(out)  # written after step 2; step 3 was lost in the crash
    assert ckpt["position"] == {"epoch": 0, "step_in_epoch": 2, "global_step": 2}
    assert not (out / "results.json").exists()

    with pytest.raises(FinetuneError, match="already holds a run"):
        finetune(_config(voc, out, "role", epochs=2), {})
    with pytest.raises(FinetuneError, match=r"different run \(lr: checkpoint 1e-05, now 0.001\)"):
        finetune(_config(voc, out, "role", epochs=2, lr=1e-3, resume=True), {})

    part = finetune(_config(voc, out, "role", epochs=2, resume=True, max_steps=4), {})
    assert not part.completed and part.stopped == "max_steps" and part.global_step == 4
    assert len(part.epochs) == 1
    assert _checkpoint(out)["position"] == {"epoch": 1, "step_in_epoch": 1, "global_step": 4}

    resumed = finetune(_config(voc, out, "role", epochs=2, resume=True), {})
    assert resumed.completed and resumed.stopped is None and resumed.global_step == 6
    for a, b in zip(whole.epochs, resumed.epochs, strict=True):
        assert {k: a[k] for k in DETERMINISTIC} == {k: b[k] for k in DETERMINISTIC}
    assert (resumed.best_epoch, resumed.test_map, resumed.test_ap) == (
        whole.best_epoch, whole.test_map, whole.test_ap)
    a, b = _checkpoint(tmp_path / "whole"), _checkpoint(out)
    assert a["position"] == b["position"] == {"epoch": 2, "step_in_epoch": 0, "global_step": 6}
    assert _same_tensors(a["model"], b["model"])  # incl. BatchNorm running statistics
    assert _same_tensors(a["optimizer"]["state"], b["optimizer"]["state"])
    assert _same_tensors(a["loss"].state_dict(), b["loss"].state_dict())  # Θ
    groups = a["optimizer"]["param_groups"]  # backbone, head (same lr for ROLE), ROLE's Θ
    assert len(groups) == 3
    assert groups[0]["lr"] == groups[1]["lr"] == pytest.approx(1e-5)
    assert groups[2]["lr"] == pytest.approx(1e-4)  # lr x lr_mult 10
    # Θ really trained: some label estimate moved away from its initial draw
    fresh = create_loss("role", k=1.5)
    fresh.manual_seed([0])
    observed = torch.from_numpy(a["loss"].observed_train.numpy())
    fresh.setup(observed, n_epochs=2)
    assert not torch.equal(fresh.label_logits, a["loss"].label_logits)

    again = finetune(_config(voc, out, "role", epochs=2, resume=True), {})  # nothing left to do
    assert again.global_step == 6 and again.epochs == resumed.epochs


def test_epoch_pass_loss_gets_train_logits(voc, tmp_path):
    """em_apl needs the train split's logits after every epoch: with warmup 1 and one epoch,
    APL pseudo-labels exactly m_i = floor(θ·U_i / max(E − warmup, 1)) entries per class."""
    result = finetune(
        _config(voc, tmp_path, "em_apl", epochs=1, batch_size=3, val_labels="observed"),
        {"warmup": 1, "theta": 0.5},
    )
    assert result.completed and result.global_step == 2  # 7 train images // 3
    loss = _checkpoint(tmp_path)["loss"]
    pool = voc["pool"]["labels"]
    train_idx, val_idx = split_pool(len(pool))
    observed = single_positive(pool, 1200)[train_idx]
    # val scored against its single positives: a class is empty unless some val row drew it
    val_observed = single_positive(pool, 1200)[val_idx]
    assert result.epochs[0]["val_n_empty_classes"] == int((val_observed.max(axis=0) < 1).sum())
    assert result.epochs[0]["test_n_empty_classes"] == int(
        (voc["test"]["labels"].max(axis=0) < 1).sum())
    unobserved = (observed == 0).sum(axis=0)
    labelled = (~torch.isnan(loss.soft_targets[0])).sum(dim=0).numpy()
    np.testing.assert_array_equal(labelled, np.floor(0.5 * unobserved / 1))
    assert result.hparams["beta"] == 0.02  # Zhou et al.'s VOC preset under the given hparams


def test_fp16_grad_scaler_and_channels_last_resume_exactly(voc, tmp_path):
    """The GPU recipe's pieces on CPU: fp16 autocast with a GradScaler (its scale and growth
    tracker go into the checkpoint) and channels_last; stopped after 1 step and resumed, the
    run ends bit-for-bit where an uninterrupted one ends."""
    kw = {"epochs": 1, "amp": "fp16", "channels_last": True}
    whole = finetune(_config(voc, tmp_path / "whole", "an", **kw))
    finetune(_config(voc, tmp_path / "split", "an", max_steps=1, **kw))
    assert _checkpoint(tmp_path / "split")["position"]["global_step"] == 1
    resumed = finetune(_config(voc, tmp_path / "split", "an", resume=True, **kw))
    assert whole.train["amp"] == "float16" and whole.train["channels_last"] is True
    a, b = _checkpoint(tmp_path / "whole"), _checkpoint(tmp_path / "split")
    assert a["scaler"] and a["scaler"] == b["scaler"]
    assert _same_tensors(a["model"], b["model"])
    assert _same_tensors(a["optimizer"]["state"], b["optimizer"]["state"])
    assert [e["val_map"] for e in whole.epochs] == [e["val_map"] for e in resumed.epochs]


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="spml")
    sub = parser.add_subparsers(dest="command", required=True)
    register_finetune_cli(sub)
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_resnet50_two_steps_from_winner_json(voc, tmp_path, capsys):
    """The real backbone (ResNet-50, random weights) for two steps through the CLI, settings
    from a winner file with one hyperparameter overridden by --set."""
    winner = tmp_path / "winner.json"
    winner.write_text(json.dumps({"loss": "an_ls", "hparams": {"eps": 0.2},
                                  "train": {"batch_size": 2, "epochs": 3}, "study": "x"}))
    out = tmp_path / "run"
    base = ["finetune", "voc", "--root", str(voc["root"]), "--out", str(out), "--from-json",
            str(winner), "--weights", "random", "--size", "32", "--no-progress", "--json"]
    assert _cli([*base, "--set", "eps=0.3", "--max-steps", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["loss"] == "an_ls" and result["hparams"] == {"eps": 0.3}
    assert result["train"]["batch_size"] == 2 and result["train"]["epochs"] == 3
    assert result["train"]["source"]["lr"] == "generic (Cole et al. end-to-end fine-tune)"
    assert result["model"]["backbone"] == "resnet50" and result["model"]["weights_random"]
    assert result["model"]["head"] == "Linear(2048, 20)"
    assert (result["global_step"], result["stopped"], result["completed"]) == (2, "max_steps",
                                                                              False)
    assert result["images_per_s"]["train"] > 0
    assert _checkpoint(out)["position"] == {"epoch": 0, "step_in_epoch": 2, "global_step": 2}

    # --resume reaches the config; the resume itself is tested through finetune() above
    parser = argparse.ArgumentParser(prog="spml")
    register_finetune_cli(parser.add_subparsers(dest="command"))
    config, hparams = config_from_args(parser.parse_args([*base, "--set", "eps=0.3", "--resume",
                                                          "--lr", "3e-5"]))
    assert config.resume and config.lr == 3e-5 and config.batch_size == 2 and config.epochs == 3
    assert hparams == {"eps": 0.3} and config.loss == "an_ls"


# --------------------------------------------------------------------------------------------
# bad input: clear errors before any work
# --------------------------------------------------------------------------------------------


def test_bad_loss_and_hparams_fail_before_reading_the_dataset(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(LossInputError, match="unknown loss 'an_lss'; did you mean 'an_ls'"):
        finetune(FinetuneConfig("voc", missing, "an_lss", tmp_path / "o"))
    with pytest.raises(LossInputError, match="unknown hyperparameter 'epsilon'"):
        finetune(FinetuneConfig("voc", missing, "an_ls", tmp_path / "o"), {"epsilon": 0.1})
    with pytest.raises(LossInputError, match="'alpha' must lie in"):
        finetune(FinetuneConfig("voc", missing, "em", tmp_path / "o"), {"alpha": -1.0})
    with pytest.raises(FileNotFoundError, match=r"dataset root .*nowhere does not exist"):
        finetune(FinetuneConfig("voc", missing, "an", tmp_path / "o", weights="random"))


def test_batch_larger_than_train_split(voc, tmp_path):
    with pytest.raises(FinetuneError, match=r"batch size 8 \(as given\) is larger than the train "
                                            r"split \(7 images"):
        finetune(_config(voc, tmp_path, "an", batch_size=8))
    assert not (tmp_path / CHECKPOINT_NAME).exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_gpu_asked_for_without_one(voc, tmp_path):
    with pytest.raises(FinetuneError, match=r"--device cuda: .*no usable CUDA GPU"):
        finetune(_config(voc, tmp_path, "an", device="cuda"))


def test_missing_pretrained_weights_refused_offline(voc, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty-torch-home"))
    with pytest.raises(FileNotFoundError, match=r"resnet50-0676ba61\.pth"):
        finetune(_config(voc, tmp_path / "o", "an", backbone="resnet50",
                         weights="imagenet1k_v1"))
    with pytest.raises(FileNotFoundError, match=r"weights file .*nope\.pth does not exist"):
        finetune(_config(voc, tmp_path / "o", "an", weights=str(tmp_path / "nope.pth")))


def test_config_checks():
    for kw, match in (({"batch_size": 0}, "--batch-size must be a positive integer"),
                      ({"lr": -1.0}, "--lr must be a positive number"),
                      ({"size": 8}, "--size must be an integer >= 16"),
                      ({"amp": "fp8"}, "--amp must be one of auto, bf16, fp16, off"),
                      ({"val_labels": "full"}, "--val-labels must be clean or observed"),
                      ({"resume": True, "overwrite": True}, "exclude each other")):
        with pytest.raises(FinetuneError, match=match):
            FinetuneConfig("voc", ".", "an", ".", **kw)


def test_winner_json_and_set_errors(tmp_path):
    path = tmp_path / "w.json"
    path.write_text('{"loss": "gr", "hparams": {"w_T": [2, 10]}}')
    with pytest.raises(FinetuneError, match="'w_T' must be a single value"):
        read_winner_json(path)
    path.write_text('{"loss": "gr", "train": {"batch_size": 8, "momentum": 0.9}}')
    with pytest.raises(FinetuneError, match=r"unknown 'train' key.*momentum; accepted: batch_size"):
        read_winner_json(path)
    path.write_text('{"loss": "gr",\n "hparams": {"w_T": 2,}}')
    with pytest.raises(FinetuneError, match=r"not valid JSON \(line 2"):
        read_winner_json(path)
    with pytest.raises(FileNotFoundError, match=r"missing\.json does not exist"):
        read_winner_json(tmp_path / "missing.json")
    path.write_text('{"loss": "an", "hparams": {}, "train": {"lr": 2e-5}}')
    assert read_winner_json(path) == ("an", {}, {"lr": 2e-5})
    with pytest.raises(FinetuneError, match="conflicts with the loss 'an'"):
        _cli(["finetune", "voc", "--root", ".", "--out", str(tmp_path), "--loss", "em",
              "--from-json", str(path)])
    with pytest.raises(FinetuneError, match="name the loss with --loss"):
        _cli(["finetune", "voc", "--root", ".", "--out", str(tmp_path)])
    with pytest.raises(FinetuneError, match="give the winner once"):
        _cli(["finetune", "voc", "--root", ".", "--out", str(tmp_path), "--from-json",
              str(path), "--from-study", str(tmp_path)])
    with pytest.raises(FileNotFoundError, match="holds no study"):
        _cli(["finetune", "voc", "--root", ".", "--out", str(tmp_path / "o"), "--from-study",
              str(tmp_path)])
    with pytest.raises(SystemExit) as exit_info:
        _cli(["finetune", "--help"])
    assert exit_info.value.code == 0
    with pytest.raises(FinetuneError, match="--set expects NAME=VALUE"):
        parse_assignments(["alpha"])
    assert parse_assignments(["a=1", "b=0.5", "c=true", "d=x"]) == {
        "a": 1, "b": 0.5, "c": True, "d": "x"}


# --------------------------------------------------------------------------------------------
# checkpoints hold the whole loss object: every registered loss must survive the round trip
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", available())
def test_every_loss_survives_the_checkpoint_round_trip(name):
    loss = create_loss(name)
    for spec in loss.hparam_specs:
        if spec.optional and loss.hparam(spec.name) is None:
            loss.set_hparam(spec.name, 1.5)
    observed = torch.zeros(6, 4, dtype=torch.int8)
    observed[torch.arange(6), torch.tensor([0, 1, 2, 3, 0, 1])] = 1
    loss.manual_seed([3])
    loss.setup(observed, n_epochs=3)
    if type(loss).prior is not None:  # VLPL, GPR: the train rows' prior (docs/priors.md)
        loss.set_prior(torch.linspace(0, 1, 24).view(6, 4))
    if type(loss).needs_features:  # SMILE: the train rows' features
        loss.set_features(torch.linspace(-1, 1, 18).view(6, 3) ** 3)
    loss.start_epoch(1)
    buf = io.BytesIO()
    torch.save({"loss": loss}, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)["loss"]
    assert _same_tensors(loss.state_dict(), back.state_dict())
    assert back.hparams_dict() == loss.hparams_dict() and back.epoch == 1
    logits = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    index = torch.tensor([0, 2, 3, 5])
    a = loss(logits, observed[index], index=index).loss
    b = back(logits, observed[index], index=index).loss
    assert math.isfinite(float(a.detach()))
    assert torch.equal(a, b)  # incl. the loss's own randomness (vPU's λ)


def test_the_finetune_parser_imports_no_torch():
    """The CLI reads the fine-tune's choices from studies.finetune.config, which imports no
    torch: building the parser (and `spml finetune --help`) stays cheap."""
    import subprocess
    import sys

    code = "import sys, studies.cli.finetune; assert 'torch' not in sys.modules, 'torch imported'"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
