"""The probe engine: many linear heads trained at once on device-resident features.

:func:`train_probe` trains T configurations ("trials") of one SPML loss as one stacked model,
evaluates all T×C columns on val after every epoch (``eval_every``), and test once at the end on
each trial's best-val head (``test_curve``: test every epoch too).

Exact semantics (what a trial *is*)
-----------------------------------
Trial ``t`` with seed ``s`` equals this plain PyTorch program, to float tolerance:

* **init**: ``torch.manual_seed(s); head = nn.Linear(D, C)`` -- weight then bias, drawn by
  ``nn.Linear``'s default initialisation from a CPU generator seeded with ``s``
  (:func:`init_head` reproduces those draws bit for bit, without touching the global RNG);
* **batch order and flips**: a second CPU generator ``torch.Generator().manual_seed(s + 2**32)``
  (:data:`ORDER_STREAM_OFFSET`: it never collides with another trial's init stream); every epoch
  draws ``perm = torch.randperm(N_train, generator=g)`` and then, when flip augmentation is on,
  ``coin = torch.randint(0, 2, (N_train,), generator=g)``: the i-th sample of the epoch is train
  row ``perm[i]``, read from the flipped features iff ``coin[i] == 1`` (:func:`epoch_order`);
* **batches**: consecutive slices of ``batch_size`` of that order; the last partial batch is
  dropped when ``drop_last`` (Cole et al.'s train DataLoader does);
* **step**: ``loss = loss_fn(head(x), observed[idx], index=idx)``, ``loss.backward()``,
  ``torch.optim.Adam`` (or SGD) step on the head (weight decay as ``torch.optim``'s L2 term) and
  on the loss's own parameters (``loss.extra_parameters()``, e.g. ROLE's Θ, at ``lr × lr_mult``,
  no weight decay); the loss's hooks ``start_epoch(e)`` before and, when
  ``loss.needs_epoch_pass``, ``end_epoch(e, logits of the unflipped train features)`` after
  every epoch; ``loss.manual_seed([s])`` after ``loss.setup(...)`` and, for a loss with
  ``needs_features``, ``loss.set_features(unflipped train features (N, D), float32)``.

Trials that share a seed share their batch order: the batch is gathered once, ``(B, D+1)``, and
multiplied by the stacked weights ``(T, D+1, C)``; the loss sees logits ``(T, B, C)`` with
per-trial hyperparameters as ``(T,)`` tensors -- the loss contract. When such trials train on
their own observed-label draws and the loss declares ``Loss.stacks_draws``, the one loss object
sees each trial's targets, ``(T, B, C)`` gathered from the draws held once on the device.
Trials with different seeds gather their own batches ``(T, B, D+1)`` (one ``bmm``); when the
loss declares ``Loss.stacks_seeds`` they still share one loss object, which sees each trial's
batch rows as ``index`` ``(T, B)``; otherwise (or for per-trial draws of a loss that does not
declare ``stacks_draws``) each trial gets its own loss object (``index`` is one row list per
call). Per-trial *folds* (``data`` a list of replicates with train and val rows of their own,
``fold_index``) train as one run too: their train features are consecutive blocks of one tensor
(:func:`probe.engine.data.stack_folds`), trial t's batch rows are offset into its fold's block,
its targets are its fold's, and it is scored on its fold's val rows; its loss object is shared
as for per-trial seeds (each trial's own ``index`` rows, ``(T, B)``).

Speed, with no semantics traded: docs/design.md "The trainer, step by step" and "What fast
means"; ``torch.compile`` only with ``--compile`` (docs/performance.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, replace
from typing import Any

import torch
from torch import Tensor

from probe.devices import resolve_device
from probe.engine.config import ProbeConfig, ProbeConfigError
from probe.engine.data import ProbeData, fold_mismatch, join_fold_blocks, train_targets
from probe.engine.loop import BlockedTrainer, StackedTrainer, deterministic, make_trainer
from probe.engine.results import EpochReport, ProbeResult, TrialResult, environment_info
from probe.engine.speed import SpeedOptions, resolve_speed
from probe.engine.trials import TrialPlan, plan_trials
from probe.evaluation.heads import Evaluator, finite
from probe.losses import Loss
from probe.progress import Progress

__all__ = ["draw_stack", "train_probe"]

Trainer = StackedTrainer | BlockedTrainer  # make_trainer's choice


def train_probe(data: ProbeData | Sequence[ProbeData], config: ProbeConfig | None = None,
                loss: Loss | str = "an",
                hparams: dict[str, Any] | Sequence[dict[str, Any]] | None = None, *,
                callback: Callable[[EpochReport], Iterable[int] | None] | None = None,
                progress: bool = False, speed: SpeedOptions | None = None,
                draws: Any | None = None, draw_index: Sequence[int] | None = None,
                fold_index: Sequence[int] | None = None) -> ProbeResult:
    """Train T linear heads at once with one SPML loss; select each trial's best epoch on val,
    then measure test once on its head.

    Args:
        data: device-resident splits (:class:`ProbeData`), moved to ``config.device`` if that
            names another device; or K *folds*, replicates with train and val rows of their own
            and one test set (``--select cv:K``; :func:`probe.engine.data.fold_mismatch` says
            what they must share), with ``fold_index``.
        config: training settings (:class:`ProbeConfig`); None = defaults.
        loss: a registry name (``"gr"``) or a ready :class:`Loss` object (then ``hparams``
            must be None, and its own hyperparameters define the trials).
        hparams: one dict (one trial) or a list of dicts (T stacked trials) of the loss's
            hyperparameters, plus optionally the per-trial ``lr`` and ``weight_decay``; missing
            keys as :func:`probe.engine.config.loss_hparams` resolves them.
        callback: called after each evaluated epoch with an :class:`EpochReport`; it returns
            the trials to stop (their weights freeze and their best epoch stays); training
            ends when every trial is stopped.
        progress: a display over epochs on stderr, one line per epoch with its val mAP and the
            best so far.
        speed: how the run uses the CPU (:class:`probe.engine.speed.SpeedOptions`); changes no
        result
            and is not recorded in the config (``result.timing`` says what was used).
        draws: K observed-label draws of the train split, (K, N_train, C) int8 in {1, 0, -1}
            (or a list of K such matrices), held once on the device; None = every trial trains
            on ``data.train_observed``.
        draw_index: with ``draws``, the draw each trial trains on (one per trial; one trial
            with several entries = that trial on each draw). A trial with seed s on draw d
            equals a run of that seed alone on data whose train_observed is draw d.
        fold_index: with K folds as ``data``, the fold each trial trains on, is validated on
            and whose val rows decide its best epoch (one per trial; one trial with several
            entries = that trial on each fold). A trial with seed s on fold k equals a run of
            that seed alone on fold k, within float rounding.

    Returns :class:`ProbeResult`. Raises an :class:`~probe.errors.SpmlError` subclass before
    training for bad settings (an unknown hyperparameter or loss, a batch size larger than the
    train split, a GPU asked for without one, ...).
    """
    t_start = time.perf_counter()
    config = config or ProbeConfig()
    config.validate()
    speed = resolve_speed(speed)
    folds = None
    if isinstance(data, ProbeData):
        if fold_index is not None:
            raise ProbeConfigError("fold_index needs folds: pass the K folds (a list of "
                                   "ProbeData) as data, or leave fold_index out")
        data = _on_device(data, config.device)
    else:
        folds = [_on_device(fold, config.device) for fold in data]
        draws, draw_index = _fold_targets(folds, fold_index, draws, config)  # checks the folds
        data = join_fold_blocks(folds)
    stack = draw_stack(draws, data)
    plan = plan_trials(data, config, loss, hparams, draw_index,
                       0 if stack is None else stack.shape[0], folds=folds)
    trainer = make_trainer(data, config, plan, speed, stack)
    results = [TrialResult(trial=t, seed=plan.seeds[t], lr=plan.lr[t],
                           weight_decay=plan.weight_decay[t],
                           hparams={k: (v.tolist() if isinstance(v, Tensor) else v)
                                    for k, v in plan.hparams[t].items()})
               for t in range(plan.n)]
    evaluator = (Evaluator(data, config, results, trainer.w, progress, folds=folds,
                           fold_index=plan.fold_index)
                 if config.eval_every > 0 else None)
    timing: dict[str, Any] = {"train_seconds": [], "eval_seconds": [], "end_epoch_seconds": []}
    with deterministic(trainer.device, config.deterministic), torch.no_grad():
        if evaluator is not None and config.eval_init:
            init = evaluator(trainer.w, trainer.live)
            for t, r in enumerate(results):
                r.init = {"val_map": init["val_map"][t], "test_map": init["test_map"][t]}
        _epochs(trainer, evaluator, results, config, timing, callback, progress)
        t0 = time.perf_counter()
        if evaluator is not None:
            evaluator.finish()
        timing["test_seconds"] = time.perf_counter() - t0
        # of which the test intervals (ProbeConfig.test_intervals)
        timing["test_interval_seconds"] = evaluator.interval_seconds if evaluator else 0.0
    timing.update(total_seconds=time.perf_counter() - t_start,
                  epochs_run=len(timing["train_seconds"]), steps_per_epoch=trainer.n_steps,
                  step_threads=trainer.threads,  # None: torch's setting
                  cuda_graph=trainer.cuda_graph,  # the steps were replayed as CUDA graphs
                  compiled=trainer.compiled,  # the step ran through torch.compile
                  trial_blocks=trainer.block_sizes)  # trials per block (SpeedOptions.trial_block)
    return _result(plan, trainer, data, config, results, evaluator, timing)


def _fold_targets(folds: list[ProbeData], fold_index: Sequence[int] | None, draws: Any | None,
                  config: ProbeConfig) -> tuple[Tensor, Sequence[int]]:
    """The folds' train targets as the run's draws (K, N_train, C), one per fold, and the
    draw of each trial (its fold); checked."""
    if not folds:
        raise ProbeConfigError("data is an empty list of folds: give one ProbeData, or K folds "
                               "with fold_index")
    if fold_index is None:
        raise ProbeConfigError(f"data is {len(folds)} folds but fold_index is missing: give the "
                               "fold each trial trains on (fold_index=[0, 1, ...])")
    if draws is not None:
        raise ProbeConfigError("draws and folds cannot be combined: each fold trains on its own "
                               "train_observed; pass one ProbeData with draws, or folds alone")
    mismatch = fold_mismatch(folds)
    if mismatch is not None:
        raise ProbeConfigError(f"data: {mismatch}; folds trained as one run need the same train "
                               "size, classes, device and test set (train them one run each)")
    return torch.stack([train_targets(fold, config.labels) for fold in folds]), fold_index


def draw_stack(draws: Any | None, data: ProbeData) -> Tensor | None:
    """``draws`` as one (K, N_train, C) int8 tensor on the data's device, checked."""
    if draws is None:
        return None
    if isinstance(draws, (list, tuple)):
        draws = torch.stack([torch.as_tensor(d) for d in draws])
    stack = torch.as_tensor(draws)
    want = (data.n_train, data.n_classes)
    if stack.ndim != 3 or tuple(stack.shape[1:]) != want:
        raise ProbeConfigError(
            f"draws: expected (K, {want[0]}, {want[1]}) observed labels of the train split; "
            f"got shape {tuple(stack.shape)}")
    values = set(torch.unique(stack).tolist())
    if not values <= {-1, 0, 1}:
        raise ProbeConfigError(
            f"draws: observed labels are 1 (positive), -1 (negative) or 0 (unknown); got "
            f"{sorted(values - {-1, 0, 1})[:3]}")
    return stack.to(torch.int8).to(data.device)


def _epochs(trainer: Trainer, evaluator: Evaluator | None, results: list[TrialResult],
            config: ProbeConfig, timing: dict[str, Any],
            callback: Callable[[EpochReport], Iterable[int] | None] | None,
            progress: bool) -> None:
    """The epoch loop: train, the losses' epoch pass, evaluate when due, ask the callback which
    trials to stop; ends early when every trial is stopped."""
    plan, epochs = trainer.plan, trainer.plan.training.epochs
    active = [True] * plan.n
    with Progress(epochs, f"probe {plan.cls.name} ×{plan.n}", "epoch", enabled=progress,
                  leave=False) as bar:
        for epoch in range(epochs):  # the loop index; every output numbers epochs from 1
            number = epoch + 1
            train_loss, seconds = trainer.train_epoch(epoch)
            timing["train_seconds"].append(seconds)
            timing["end_epoch_seconds"].append(trainer.end_epoch(epoch))
            t0 = time.perf_counter()
            due = number % max(config.eval_every, 1) == 0 or number == epochs
            record = evaluator(*_live_heads(trainer, active), number) if evaluator and due else {}
            timing["eval_seconds"].append(time.perf_counter() - t0)
            _record_epoch(results, active, number, train_loss, record)
            if record:  # the epoch's line first, then the count that includes it
                bar.write(_best_line(results, evaluator, active, number, epochs))
            bar.update()
            if not record or callback is None:
                continue
            stop = callback(EpochReport(
                epoch=number, train_loss=[v if a else None for v, a in zip(train_loss, active)],
                val_map=list(record["val_map"]),
                test_map=list(record.get("test_map", [None] * plan.n)),
                active=list(active), heads=_live_heads(trainer, active)[0]))
            stop = [t for t in (int(t) for t in (stop or ())) if 0 <= t < plan.n and active[t]]
            for t in stop:
                active[t] = False
                results[t].stopped_at = number
            if stop:
                trainer.stop(stop)
                if not any(active):
                    return


def _live_heads(trainer: Trainer, active: list[bool]) -> tuple[Tensor, list[int]]:
    """The heads of the active trials (rows of the trainer's stack) and their trial ids."""
    live, w = trainer.live, trainer.w  # a BlockedTrainer builds both on each access
    pos = [j for j, t in enumerate(live) if active[t]]
    if len(pos) == w.shape[0]:
        return w, list(live)
    return w[torch.tensor(pos, device=w.device)], [live[j] for j in pos]


def _record_epoch(results: list[TrialResult], active: list[bool], epoch: int,
                  train_loss: list[float], record: dict[str, list]) -> None:
    """Append epoch ``epoch``'s row (counted from 1) to every active trial; flag trials that
    went non-finite."""
    for t, result in enumerate(results):
        if not active[t]:
            continue
        row = {"epoch": epoch, "train_loss": train_loss[t], **{k: v[t] for k, v in record.items()}}
        result.epochs.append(row)
        if not all(finite(v) for v in row.values() if isinstance(v, float)):
            result.finite = False


def _best_line(results: list[TrialResult], evaluator: Evaluator | None, active: list[bool],
               epoch: int, epochs: int) -> str:
    """The per-epoch line: this epoch's val mAP (its best trial's, where several train) and,
    labelled apart, the best so far with the epoch it came from."""
    assert evaluator is not None
    head = f"epoch {epoch}/{epochs}"
    now = {t: r.epochs[-1].get("val_map") for t, r in enumerate(results)
           if active[t] and r.epochs and r.epochs[-1].get("epoch") == epoch}
    now = {t: v for t, v in now.items() if finite(v)}
    which = (lambda t: f" (trial {t})") if len(results) > 1 else (lambda t: "")
    parts = []
    if now:
        t = max(now, key=lambda k: now[k])
        parts.append(f"val mAP {now[t]:.2f}{which(t)}")
    live = [t for t in range(len(results)) if active[t] and finite(evaluator.best_val[t])]
    if not live:
        return f"{head}: no trial with a finite val mAP yet"
    b = max(live, key=lambda t: evaluator.best_val[t])
    best = results[b].best
    test = f", test mAP {best['test_map']:.2f}" if "test_map" in best else ""
    at = f"epoch {results[b].best_epoch}" if results[b].best_epoch is not None else ""
    where = ", ".join(x for x in (which(b).strip(" ()"), at) if x)
    parts.append(f"best so far val mAP {best.get('val_map', float('nan')):.2f}{test}"
                 + (f" ({where})" if where else ""))
    return f"{head}: " + "; ".join(parts)


def _result(plan: TrialPlan, trainer: Trainer, data: ProbeData, config: ProbeConfig,
            results: list[TrialResult], evaluator: Evaluator | None,
            timing: dict[str, Any]) -> ProbeResult:
    notes = list(plan.notes)
    if config.flip and not data.has_flip:
        notes.append("flip augmentation off: the data has no flipped features")
    resolved = {**asdict(config), **plan.training.to_dict(), "device": str(trainer.device),
                "flip_used": trainer.flip, "notes": notes}
    result = ProbeResult(
        loss=plan.cls.name, config=resolved, trials=results, class_names=list(data.class_names),
        dataset=data.dataset, source=dict(data.source), timing=timing,
        environment=environment_info(trainer.device), shared_batch_order=plan.one_order,
        best_heads=evaluator.best_heads() if evaluator is not None else None,
        final_heads=trainer.final_heads())
    if evaluator is not None and config.test_intervals:
        from probe.evaluation.intervals import record_test_intervals

        record_test_intervals(result, evaluator.intervals, n_resamples=config.test_intervals)
    return result


def _on_device(data: ProbeData, device_name: str) -> ProbeData:
    """``data`` on the config's device (``"auto"``: where the data already is)."""
    device = data.device if device_name == "auto" else resolve_device(device_name)
    if device == data.device:
        return data
    moved = {k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in vars(data).items()}
    return replace(data, **moved)
