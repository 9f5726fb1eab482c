"""End-to-end fine-tuning of the backbone + a linear head on the images, to confirm the winners
of a linear-probe study (docs/design.md "The flow": studies ──finetune──▶ confirmed winners).

Cole et al. (2021)'s reference procedure (``train_mode='end_to_end'`` of
``elijahcole/single-positive-multi-label``, followed by GR Loss, EM/APL and Large-Loss) with the
probe's protocol (docs/protocol.md): the adapter's pool split train/val by ``split_pool(n, 1200)``,
single positives drawn on the pool (``observed_seed``), clean val (or ``val_labels="observed"``),
clean test; images resized to S×S without crop (a ``timm:``, ``open_clip:`` or ``hf:`` backbone:
its own preprocessing), a random flip per training image; the registry's backbone made
trainable, in ``train()`` mode, plus ``nn.Linear(D, C)`` at PyTorch's default init; Adam with one
lr for backbone and head, a loss's own tensors (``extra_parameters()``) at ``lr × mult``, no
weight decay or schedule; a seeded batch order per epoch, the last incomplete batch dropped;
``needs_epoch_pass`` losses get a no-grad eval pass over the unflipped train images; the test
mAP is read at the best val epoch (the first on ties). Batch size, lr and epochs:
:func:`probe.engine.config.resolve_training` (the paper's, else ``GENERIC_FINETUNE``).

On top: AMP (bf16, or fp16 with a ``GradScaler``) and channels_last on CUDA, PIL decoding in
DataLoader workers, normalisation and flips on the device, atomic checkpoints (every epoch and
every ``checkpoint_every`` steps) that resume bit-for-bit on CPU. ``images_per_s`` counts
training steps with image loading; ``train_steady`` leaves out this process's first 10 steps.
All randomness derives from ``seed``: the head's init, epoch ``e``'s order then flip bits
(``SeedSequence([seed, e])``), the loss's ``manual_seed([seed])``, the global RNGs (saved in
checkpoints); random backbone weights use ``weights_seed``.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections import OrderedDict
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from probe.engine.results import write_json_atomic
from probe.errors import MissingPathError
from studies.finetune.config import (
    AMP_MODES,
    BEST_MODEL_NAME,
    CHECKPOINT_FORMAT,
    CHECKPOINT_NAME,
    RESULTS_NAME,
    TRAIN_JSON_KEYS,
    WARMUP_STEPS,
    FinetuneConfig,
    FinetuneError,
    FinetuneResult,
    jsonable,
    read_winner_json,
    save_torch,
)
from studies.finetune.data import FinetuneData, FinetuneInputs, epoch_order, load_data, make_loader

__all__ = ["AMP_MODES", "TRAIN_JSON_KEYS", "FinetuneConfig", "FinetuneError", "FinetuneResult",
           "finetune", "read_winner_json"]


def refuse_probe_only(cls: Any) -> None:
    """Refuse a loss the fine-tune cannot feed: one that reads a store prior by train row, or
    the train split's features once before training; each with the command that trains it."""
    if cls.prior is not None:  # docs/priors.md: the fine-tune reads images, not a store's rows
        raise FinetuneError(
            f"--loss {cls.name} reads a store prior (per-image CLIP scores), which the "
            "fine-tune cannot pass yet; probe it instead (spml probe STORE --loss "
            f"{cls.name} --priors NAME)"
        )
    if cls.needs_features:  # SMILE: a graph and networks over fixed features, set up once
        raise FinetuneError(
            f"--loss {cls.name} reads the train split's features once, before training "
            "(its label-enhancement networks run on their nearest-neighbour graph), and a "
            "fine-tune changes the features every step; probe it instead (spml probe STORE "
            f"--loss {cls.name})")


def build_loss(config: FinetuneConfig, hparams: Mapping[str, Any], data: FinetuneData
               ) -> tuple[Any, str | None, dict[str, Any]]:
    """The loss object: the dataset's paper preset (``config.preset``: "auto" = the dataset's
    if the loss has one) under the given hparams, with the values the dataset decides (k) filled
    in by :func:`probe.engine.config.loss_hparams`, as the probe does. Returns (loss, preset,
    filled)."""
    from probe.engine.config import loss_hparams
    from probe.losses import create_loss, get_loss_class

    cls = get_loss_class(config.loss)  # unknown name: LossInputError with a suggestion
    refuse_probe_only(cls)
    preset = config.preset
    if preset == "auto":
        preset = data.name if data.name in cls.presets else None
    elif preset is not None:
        create_loss(config.loss, preset=preset)  # an unknown preset: the registry's message
    val_k = float(data.val_clean.sum(axis=1).mean()) if len(data.val_clean) else 0.0
    try:
        (merged,), _ = loss_hparams(cls, [dict(hparams)], data.name, len(data.class_names),
                                    lambda: val_k, preset=preset)
    except ValueError as err:
        raise FinetuneError(f"finetune: {err}") from None
    given = dict(cls.presets.get(preset, {})) if preset else {}
    given.update(hparams)
    filled = {s.name: merged[s.name] for s in cls.hparam_specs
              if s.optional and given.get(s.name) is None}
    return cls(**merged), preset, filled


@dataclass
class _Plan:
    """A checked run: everything resolved, nothing trained yet."""

    config: FinetuneConfig
    device: torch.device
    amp_dtype: torch.dtype | None
    channels_last: bool
    num_workers: int
    eval_batch_size: int
    train: dict[str, Any]
    data: FinetuneData
    loss: Any
    preset: str | None
    filled: dict[str, float]
    backbone: Any
    transform: Any  # featurize.extract.images.ImageTransform: the images' preprocessing
    steps_per_epoch: int
    out: Path


def _prepare(config: FinetuneConfig, loss_hparams: Mapping[str, Any]) -> _Plan:
    """Check everything the run needs, cheapest first; raise before any training work."""
    from featurize.backbones import get_spec, load_backbone, resolve_weights
    from featurize.extract.run import backbone_transform
    from featurize.specs import family_of
    from probe.devices import resolve_device
    from probe.engine.config import resolve_training
    from probe.losses import create_loss, get_loss_class

    cls = get_loss_class(config.loss)
    refuse_probe_only(cls)  # before any image or weight loads
    # hparams are validated now (names, ranges); the loss is built for real once the dataset,
    # and so its paper preset, is known
    create_loss(config.loss, **dict(loss_hparams))
    try:
        device = resolve_device(config.device)
    except ValueError as err:
        raise FinetuneError(f"finetune: {err}") from None
    if config.amp == "auto":
        amp_dtype = None  # the CPU trains in float32
        if device.type == "cuda":
            amp_dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    else:
        amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}[config.amp]
    root = Path(config.root).expanduser()
    if not root.exists():
        raise MissingPathError(
            f"finetune: dataset root {root} does not exist (--root); point it at the folder "
            f"that holds the {config.dataset} files"
        )
    out = Path(config.out).expanduser()
    ckpt = out / CHECKPOINT_NAME
    if ckpt.exists() and not (config.resume or config.overwrite):
        raise FinetuneError(
            f"finetune: {out} already holds a run ({ckpt.name}); pass --resume to continue it, "
            "--overwrite to start over, or choose another --out"
        )
    if out.exists() and not out.is_dir():
        raise FinetuneError(f"finetune: --out {out} exists and is not a directory")
    spec = get_spec(config.backbone)
    if config.weights != "random":
        info = resolve_weights(spec, config.weights)  # missing offline: the registry's message
        if config.weights_sha256 and info.sha256 != config.weights_sha256:
            raise FinetuneError(
                f"finetune: the weights file {info.path} has sha256 {info.sha256[:12]}…, the "
                f"store's backbone was made with {config.weights_sha256[:12]}…; pass the "
                "store's weights file with --weights PATH"
            )
    data = load_data(config)
    # the backbone's lr; the head trains at lr × head_lr_mult
    s = resolve_training(cls, data.name, batch_size=config.batch_size, lr=config.lr,
                         epochs=config.epochs, mode="finetune")
    train = {"batch_size": s.batch_size, "lr": s.lr, "epochs": s.epochs,
             "head_lr_mult": s.head_lr_mult, "source": dict(s.sources)}
    n_train = len(data.train_paths)
    if train["batch_size"] > n_train:
        raise FinetuneError(
            f"finetune: batch size {train['batch_size']} ({train['source']['batch_size']}) is "
            f"larger than the train split ({n_train} images of {data.name}); incomplete batches "
            "are dropped, so no step could run: pass a smaller --batch-size"
        )
    loss, preset, filled = build_loss(config, loss_hparams, data)
    protocol = config.transform == "protocol" or (
        config.transform == "auto" and family_of(config.backbone) is None
    )
    backbone = load_backbone(config.backbone, config.weights, seed=config.weights_seed,
                             size=config.size if protocol else None, embed=config.embed)
    transform = backbone_transform(backbone, config.size, "protocol" if protocol else "model")
    workers = config.num_workers
    if workers is None:
        workers = max(1, min(16, (os.cpu_count() or 2) - 1)) if device.type == "cuda" else 0
    channels_last = (device.type == "cuda" if config.channels_last is None
                     else bool(config.channels_last))
    return _Plan(config=config, device=device, amp_dtype=amp_dtype, channels_last=channels_last,
                 num_workers=workers,
                 eval_batch_size=config.eval_batch_size or max(2 * train["batch_size"], 32),
                 train=train, data=data, loss=loss, preset=preset, filled=filled,
                 backbone=backbone, transform=transform,
                 steps_per_epoch=n_train // train["batch_size"], out=out)


def _transform_fingerprint(plan: _Plan) -> dict[str, Any]:
    """The transform and embedding where they are not the protocol's (square resize, no crop,
    pooled): checkpoints of the protocol's runs keep the fingerprint they always had."""
    protocol = (plan.transform.resize == "square" and plan.transform.crop is None
                and plan.backbone.embed == "pooled")
    if protocol:
        return {}
    return {"transform": plan.transform.describe(), "embed": plan.backbone.embed}


def _fingerprint(plan: _Plan) -> dict[str, Any]:
    """What determines the trajectory; a checkpoint only resumes a run that agrees on all of it."""
    c = plan.config
    return jsonable({
        "dataset": plan.data.name, "root": str(Path(c.root).expanduser().resolve()),
        "dataset_options": dict(c.dataset_options), "loss": c.loss,
        "hparams": plan.loss.hparams_dict(),
        **{k: plan.train[k] for k in ("batch_size", "lr", "epochs")},
        "backbone": c.backbone, "weights": plan.backbone.weights.id,
        "weights_sha256": plan.backbone.weights.sha256, "size": c.size,
        **_transform_fingerprint(plan),
        "seed": c.seed, "observed_seed": c.observed_seed, "val_labels": c.val_labels,
        "n_train": len(plan.data.train_paths), "amp": str(plan.amp_dtype),
        "channels_last": plan.channels_last, "device_type": plan.device.type,
    })


# what a checkpoint restores besides the model, optimiser, loss and RNGs
_POSITION = ("epoch", "step_in_epoch", "global_step")  # step_in_epoch steps of epoch are done
_COUNTERS = ("train_images", "train_seconds", "eval_images", "eval_seconds")


class FinetuneRun:
    """State of one fine-tuning run; ``run()`` trains, evaluates, checkpoints."""

    def __init__(self, plan: _Plan) -> None:
        self.plan = plan
        cfg, dev = plan.config, plan.device
        self.out = plan.out
        self.ckpt_path = self.out / CHECKPOINT_NAME
        # head: nn.Linear's default init (Cole et al.'s linear_classifier) from its own seed
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            head = nn.Linear(plan.backbone.feature_dim, len(plan.data.class_names))
        # backbone (pooled features, trainable) + linear head: Cole et al.'s ImageClassifier
        features = plan.backbone.features.requires_grad_(True).train()
        self.model = nn.Sequential(OrderedDict(features=features, flatten=nn.Flatten(1),
                                               head=head)).to(dev)
        if plan.channels_last:
            self.model.to(memory_format=torch.channels_last)
        if dev.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed input shapes: autotune once
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)
        random.seed(cfg.seed)
        self.observed = torch.from_numpy(plan.data.observed_train).to(dev)
        self.loss = plan.loss
        self.loss.manual_seed([cfg.seed])
        self.loss.setup(self.observed, n_epochs=plan.train["epochs"])
        self.loss.to(dev)
        self.inputs = FinetuneInputs(plan)
        self.scaler = torch.amp.GradScaler(dev.type, enabled=plan.amp_dtype == torch.float16)
        self.epoch, self.step_in_epoch, self.global_step = 0, 0, 0  # _POSITION
        self.loss_sum = torch.zeros((), device=dev)
        self.history: list[dict[str, Any]] = []
        self.best: dict[str, Any] | None = None
        self.train_images, self.train_seconds = 0, 0.0
        self.eval_images, self.eval_seconds = 0, 0.0
        # steady-state throughput: this process's training steps after the first few
        self.process_steps, self.warm = 0, False
        self.steady_images, self.steady_seconds = 0, 0.0
        self.stopped: str | None = None
        self.dirty = True  # state not yet in a checkpoint
        self.fingerprint = _fingerprint(plan)
        self.optimizer = self._make_optimizer()

    def _make_optimizer(self) -> torch.optim.Optimizer:
        """Adam: the backbone at lr, the head at lr × head_lr_mult (1 — Cole's one lr — unless
        the paper's released code trains its head faster, e.g. GR/LL: 10), the loss's own
        parameters at lr × their multiplier (Cole's g_params)."""
        lr = self.plan.train["lr"]
        parts = ((self.model.features, 1), (self.model.head, self.plan.train["head_lr_mult"]))
        groups = [{"params": [p for p in part.parameters() if p.requires_grad], "lr": lr * mult}
                  for part, mult in parts]
        groups += [{"params": [param], "lr": lr * float(mult)}
                   for param, mult in self.loss.extra_parameters()]
        return torch.optim.Adam(groups, lr=lr, fused=self.plan.device.type == "cuda" or None)

    def _autocast(self):
        return (nullcontext() if self.plan.amp_dtype is None
                else torch.autocast(self.plan.device.type, dtype=self.plan.amp_dtype))

    @torch.no_grad()
    def _predict(self, paths: list[str]) -> Tensor:
        """Logits ``(N, C)`` float32 of unflipped images, model in eval mode."""
        n, bs = len(paths), self.plan.eval_batch_size
        batches = [list(range(i, min(i + bs, n))) for i in range(0, n, bs)]
        out = torch.empty((n, len(self.plan.data.class_names)), device=self.plan.device)
        self.model.eval()
        start = time.perf_counter()
        try:
            for i, (x, _rows) in enumerate(make_loader(self.plan, paths, batches)):
                with self._autocast():
                    logits = self.model(self.inputs(x))
                out[i * bs : i * bs + logits.shape[0]] = logits.float()
        finally:
            self.model.train()
        self._sync()
        self.eval_images += n
        self.eval_seconds += time.perf_counter() - start
        return out

    def _sync(self) -> None:
        if self.plan.device.type == "cuda":
            torch.cuda.synchronize(self.plan.device)

    def _evaluate(self, paths: list[str], targets: np.ndarray) -> dict[str, Any]:
        from probe.metrics import f1_scores, mean_average_precision

        logits = self._predict(paths)
        t = torch.from_numpy(targets).to(logits.device)
        m = mean_average_precision(t, logits=logits)
        f1 = f1_scores(t, logits=logits, threshold=self.plan.config.threshold)
        return {
            "map": float(m.map),
            "ap": (100.0 * m.ap).tolist(),  # percent, the scale of mAP
            "n_empty_classes": int(m.n_empty_classes),
            "f1": {k: float(v) for k, v in f1.to_dict().items()},
        }

    def _state(self) -> dict[str, Any]:
        rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
               "python": random.getstate()}
        if self.plan.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return {
            "format": CHECKPOINT_FORMAT,
            "fingerprint": self.fingerprint,
            "position": {k: getattr(self, k) for k in _POSITION},
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            # the whole loss object: buffers/parameters (state_dict) and any host-side state
            # (vPU's numpy generators, schedules) -- a resumed run continues it exactly
            "loss": self.loss, "loss_sum": self.loss_sum, "rng": rng,
            "history": self.history, "best": self.best,
            "counters": {k: getattr(self, k) for k in _COUNTERS},
        }

    def save_checkpoint(self) -> None:
        """Write the run's state atomically (skipped when nothing changed since the last)."""
        if not self.dirty:
            return
        save_torch(self._state(), self.ckpt_path)
        self.dirty = False

    def restore(self) -> None:
        """Load ``out/checkpoint.pt`` (written by this code for the same run: it holds a pickled
        loss object, so only load checkpoints you wrote)."""
        try:
            state = torch.load(self.ckpt_path, map_location=self.plan.device, weights_only=False)
        except Exception as err:  # a truncated or foreign file
            raise FinetuneError(
                f"finetune: cannot read checkpoint {self.ckpt_path}: {err}; pass --overwrite to "
                "start over"
            ) from None
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
            raise FinetuneError(
                f"finetune: {self.ckpt_path} is not a finetune checkpoint of this version "
                f"(format {state.get('format') if isinstance(state, dict) else None!r})"
            )
        saved, now = state["fingerprint"], self.fingerprint
        differ = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
        if differ:
            detail = "; ".join(f"{k}: checkpoint {saved.get(k)!r}, now {now.get(k)!r}"
                               for k in differ)
            raise FinetuneError(
                f"finetune: the checkpoint in {self.out} is from a different run ({detail}); "
                "resume with the same settings, or pass --overwrite / another --out"
            )
        self.model.load_state_dict(state["model"])
        self.loss = state["loss"].to(self.plan.device)
        self.optimizer = self._make_optimizer()
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.loss_sum = state["loss_sum"].to(self.plan.device)
        for group, keys in (("position", _POSITION), ("counters", _COUNTERS)):
            for key in keys:
                setattr(self, key, state[group][key])
        self.dirty = False
        self.history, self.best = state["history"], state["best"]
        rng = state["rng"]
        torch.set_rng_state(rng["torch"].cpu())
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])
        if "cuda" in rng and self.plan.device.type == "cuda":
            torch.cuda.set_rng_state_all([s.cpu() for s in rng["cuda"]])

    def _train_steps(self, bar) -> bool:
        """Run the rest of epoch ``self.epoch``; False if stopped by ``max_steps``."""
        plan, cfg = self.plan, self.plan.config
        bs, steps = plan.train["batch_size"], plan.steps_per_epoch
        batches, flips = epoch_order(cfg.seed, self.epoch, len(plan.data.train_paths), steps, bs)
        todo = batches[self.step_in_epoch :].tolist()
        flips_dev = flips.to(plan.device)
        if not todo:
            return True
        start = time.perf_counter()
        images = 0
        for x, rows in make_loader(plan, plan.data.train_paths, todo):
            rows = rows.to(plan.device, non_blocking=True)
            inputs = self.inputs(x, flips_dev[rows])
            with self._autocast():
                logits = self.model(inputs)
            out = self.loss(logits.float(), self.observed[rows], index=rows)
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.scale(out.loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.loss_sum += out.loss.detach()
            self.step_in_epoch += 1
            self.global_step += 1
            self.process_steps += 1
            self.dirty = True
            images += bs
            bar.update(bs)
            if self.process_steps == WARMUP_STEPS:  # steady-state timing starts here
                self._account(images, start)
                images, start = 0, time.perf_counter()
                self.warm = True
            if self.step_in_epoch % 25 == 0:
                bar.set_postfix(f"loss={self.loss_sum.item() / self.step_in_epoch:.4g}")
            if self.step_in_epoch == steps:
                break  # the epoch's end is checkpointed after its evaluation
            if cfg.max_steps is not None and self.global_step >= cfg.max_steps:
                self.stopped = "max_steps"
                break
            if cfg.checkpoint_every and self.global_step % cfg.checkpoint_every == 0:
                self._account(images, start)
                images, start = 0, time.perf_counter()
                self.save_checkpoint()
        self._account(images, start)
        return self.stopped is None

    def _account(self, images: int, start: float) -> None:
        """Add a finished stretch of training steps (``images`` since ``start``) to the
        throughput counters; waits for the device so the time is real."""
        self._sync()
        seconds = time.perf_counter() - start
        self.train_images += images
        self.train_seconds += seconds
        if self.warm:
            self.steady_images += images
            self.steady_seconds += seconds

    def _end_epoch(self) -> None:
        """The per-epoch pass (if the loss needs one), evaluation, best selection, checkpoint."""
        plan = self.plan
        # this epoch's share of the throughput counters (the pass and evaluation add none)
        images = self.train_images - sum(h["train_images"] for h in self.history)
        seconds = self.train_seconds - sum(h["train_seconds"] for h in self.history)
        if self.loss.needs_epoch_pass:
            train_logits = self._predict(plan.data.train_paths)
            with torch.no_grad():
                self.loss.end_epoch(self.epoch, train_logits.unsqueeze(0))
        else:
            self.loss.end_epoch(self.epoch, None)
        val = self._evaluate(plan.data.val_paths, plan.data.val_targets)
        test = self._evaluate(plan.data.test_paths, plan.data.test_targets)
        record = {
            "epoch": self.epoch + 1,  # counted from 1 in every output (self.epoch: loop index)
            "steps": plan.steps_per_epoch, "global_step": self.global_step,
            "train_loss": float(self.loss_sum) / max(plan.steps_per_epoch, 1),
            **{f"{split}_{key}": scores[key] for split, scores in (("val", val), ("test", test))
               for key in ("map", "n_empty_classes", "f1")},
            "train_images": images, "train_seconds": seconds,
            "train_images_per_s": images / seconds if seconds > 0 else None,
        }
        self.history.append(record)
        if math.isfinite(val["map"]) and (self.best is None or val["map"] > self.best["val_map"]):
            self.best = {"epoch": self.epoch + 1, "val_map": val["map"], "test_map": test["map"],
                         "test_f1": test["f1"],
                         "test_ap": dict(zip(plan.data.class_names, test["ap"]))}
            if plan.config.save_best:
                save_torch({"model": self.model.state_dict(), "epoch": self.epoch + 1,
                             "class_names": list(plan.data.class_names),
                             "fingerprint": self.fingerprint}, self.out / BEST_MODEL_NAME)
        self.epoch += 1
        self.step_in_epoch = 0
        self.loss_sum = torch.zeros((), device=plan.device)
        self.dirty = True
        self.save_checkpoint()
        self.write_results()

    def run(self) -> FinetuneResult:
        plan = self.plan
        epochs, steps, bs = plan.train["epochs"], plan.steps_per_epoch, plan.train["batch_size"]
        from probe.progress import Progress

        while self.epoch < epochs:
            if plan.config.max_steps is not None and self.global_step >= plan.config.max_steps:
                self.stopped = "max_steps"
                break
            if self.step_in_epoch == 0:
                self.loss.start_epoch(self.epoch)
            with Progress(steps * bs, f"epoch {self.epoch + 1}/{epochs}", "img",
                          initial=self.step_in_epoch * bs,
                          enabled=plan.config.progress) as bar:
                if not self._train_steps(bar):  # stopped by max_steps
                    break
            self._end_epoch()
        self.save_checkpoint()
        return self.write_results()

    def result(self) -> FinetuneResult:
        plan = self.plan
        steady = self.steady_images / self.steady_seconds if self.steady_seconds else None
        best = self.best or {}
        return FinetuneResult(
            config=plan.config.to_dict(), loss=self.loss.name, hparams=self.loss.hparams_dict(),
            train={
                **{k: plan.train[k] for k in ("batch_size", "lr", "epochs", "source")},
                "optimizer": "adam", "steps_per_epoch": plan.steps_per_epoch,
                "loss_preset": plan.preset, "hparams_from_dataset": plan.filled,
                "device": str(plan.device),
                "amp": None if plan.amp_dtype is None else str(plan.amp_dtype).split(".")[-1],
                "channels_last": plan.channels_last, "num_workers": plan.num_workers,
            },
            data=plan.data.summary(),
            model={"backbone": plan.backbone.name, **plan.backbone.provenance(),
                   "head": f"Linear({plan.backbone.feature_dim}, {len(plan.data.class_names)})",
                   "transform": plan.transform.describe(), "torch": torch.__version__},
            epochs=self.history, best_epoch=best.get("epoch"), best_val_map=best.get("val_map"),
            test_map=best.get("test_map"), test_ap=best.get("test_ap"),
            test_f1=best.get("test_f1"), global_step=self.global_step,
            completed=self.epoch >= plan.train["epochs"], stopped=self.stopped,
            images_per_s={
                "train": self.train_images / self.train_seconds if self.train_seconds else None,
                "train_steady": steady,
                "eval": self.eval_images / self.eval_seconds if self.eval_seconds else None,
            },
            paths={
                "out": str(self.out), "results": str(self.out / RESULTS_NAME),
                "checkpoint": str(self.ckpt_path),
                "best_model": str(self.out / BEST_MODEL_NAME)
                if plan.config.save_best and self.best else None,
            },
        )

    def write_results(self) -> FinetuneResult:
        result = self.result()
        write_json_atomic(self.out / RESULTS_NAME, result.to_dict())
        return result


def finetune(config: FinetuneConfig, loss_hparams: Mapping[str, Any] | None = None
             ) -> FinetuneResult:
    """Fine-tune ``config.backbone`` + a linear head end to end with loss ``config.loss`` and
    hyperparameters ``loss_hparams`` (over the dataset's paper preset), per the module doc.
    Every input problem (unknown loss or hyperparameter, missing root or weights, no GPU, a
    batch larger than the train split, a run in ``out`` without ``resume``/``overwrite``)
    raises before any training work. With ``resume`` the run in
    ``config.out`` continues from its checkpoint (same settings required; ``max_steps`` may
    differ). Returns the result, also written to ``out/results.json``."""
    if loss_hparams is not None and not isinstance(loss_hparams, Mapping):
        raise FinetuneError(
            f"finetune: loss_hparams must be a dict of name -> value; got "
            f"{type(loss_hparams).__name__}"
        )
    plan = _prepare(config, dict(loss_hparams or {}))
    if config.overwrite:
        for name in (CHECKPOINT_NAME, RESULTS_NAME, BEST_MODEL_NAME):
            (plan.out / name).unlink(missing_ok=True)
    run = FinetuneRun(plan)
    if config.resume and run.ckpt_path.exists():
        run.restore()
    return run.run()
