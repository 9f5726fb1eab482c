"""The training loop of the probe engine: T stacked heads, one epoch at a time.

:class:`StackedTrainer` holds a run's training state -- the stacked heads ``(T, D+1, C)``, the
stacked optimizer, the loss objects and the batch-order streams -- and trains one epoch per
:meth:`StackedTrainer.train_epoch` call. The semantics (what a trial *is*) are those of
:mod:`probe.engine.train`'s docstring: :func:`init_head` and :func:`epoch_order` reproduce the plain
PyTorch program's random draws exactly.

The hot path, :meth:`StackedTrainer._step`, is four named steps: gather the batch and form the
logits; let autograd differentiate the loss w.r.t. the logits only; ``dW = Xᵀ·dZ`` as one matrix
product; one fused optimizer update. Nothing in an epoch waits for the device. With
``--compile`` the same arithmetic runs as one ``torch.compile``-d function (``_fused_step``).

On the CPU, many COCO-sized heads train in blocks (:class:`BlockedTrainer`, one
:class:`StackedTrainer` per block of :func:`trial_blocks`), each block through the whole epoch
before the next, so that its state stays in cache; :func:`make_trainer` picks.
"""

from __future__ import annotations

import contextlib
import math
import time
import timeit
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace

import torch
from torch import Tensor, nn

from probe.devices import inductor_unavailable
from probe.engine.config import ProbeConfig, ProbeConfigError
from probe.engine.data import ProbeData, positions_by_fold, train_targets
from probe.engine.logits import stacked_logits
from probe.engine.optim import StackedAdam, TrialParam, make_optimizer
from probe.engine.speed import (
    SpeedOptions,
    choose_threads,
    clear_winner,
    remembered_threads,
)
from probe.engine.threads import step_threads
from probe.engine.trials import LossGroup, TrialPlan, setup_loss_groups
from probe.losses import per_trial_rows, trial_rows

__all__ = ["ORDER_STREAM_OFFSET", "TRIAL_BLOCK_BYTES", "BlockedTrainer", "StackedTrainer",
           "deterministic", "epoch_order", "init_head", "make_trainer", "order_generator",
           "step_arithmetic", "sync", "trial_blocks"]

#: the batch-order stream of seed s is seeded with s + 2**32 (init uses s itself)
ORDER_STREAM_OFFSET = 2**32
#: steps per captured CUDA graph: on an H100 the GPU's kernels bound the replayed step, not the
#: host's launches, so more steps per graph gain nothing but each holds its own temporaries
GRAPH_STEPS = 1
#: CPU: the training state (head, gradient, optimizer state) one block of stacked trials may
#: hold, so that it stays in the last-level cache (docs/design.md "Trial blocks on the CPU")
TRIAL_BLOCK_BYTES = 24 << 20


def init_head(seed: int, in_features: int, out_features: int) -> tuple[Tensor, Tensor]:
    """``(weight (C, D), bias (C,))`` exactly as ``torch.manual_seed(seed); nn.Linear(D, C)``
    draws them (``nn.Linear.reset_parameters``: Kaiming-uniform weight with a=√5, then a
    uniform bias in ±1/√D), from a private CPU generator (the global RNG is not touched)."""
    g = torch.Generator().manual_seed(int(seed))
    weight = torch.empty(out_features, in_features)
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=g)
    bound = 1 / math.sqrt(in_features) if in_features > 0 else 0.0
    bias = torch.empty(out_features)
    nn.init.uniform_(bias, -bound, bound, generator=g)
    return weight, bias


def order_generator(seed: int) -> torch.Generator:
    """The batch-order stream of a trial with ``seed`` (see :mod:`probe.engine.train`)."""
    return torch.Generator().manual_seed(int(seed) + ORDER_STREAM_OFFSET)


def epoch_order(g: torch.Generator, n: int, flip: bool) -> tuple[Tensor, Tensor]:
    """One epoch's ``(perm, rows)`` from the order stream ``g``: ``perm`` (n,) train rows in
    visiting order; ``rows`` the same rows offset by ``n`` where the sample is flipped
    (the row index into :attr:`ProbeData.train_x`)."""
    perm = torch.randperm(n, generator=g)
    if not flip:
        return perm, perm
    return perm, perm + torch.randint(0, 2, (n,), generator=g) * n  # the coins: flipped or not


def stacked_init(seeds: list[int], d1: int, c: int) -> Tensor:
    """Initial heads ``(T, D+1, C)`` (bias in the last row), trial t drawn from ``seeds[t]``."""
    w = torch.empty(len(seeds), d1, c, dtype=torch.float32)
    drawn: dict[int, Tensor] = {}
    for t, s in enumerate(seeds):
        if s not in drawn:
            weight, bias = init_head(s, d1 - 1, c)
            drawn[s] = torch.cat([weight.T, bias[None]])
        w[t] = drawn[s]
    return w


@contextlib.contextmanager
def deterministic(device: torch.device, enabled: bool) -> Iterator[None]:
    """On CUDA, deterministic kernels for the run (restored afterwards); CPU is deterministic."""
    if not (enabled and device.type == "cuda"):
        yield
        return
    before = torch.are_deterministic_algorithms_enabled()
    warn_before = torch.is_deterministic_algorithms_warn_only_enabled()
    _set_deterministic(True, warn_only=True)
    try:
        yield
    finally:
        _set_deterministic(before, warn_only=warn_before)


def _set_deterministic(mode: bool, warn_only: bool) -> None:
    """``torch.use_deterministic_algorithms`` without its import of ``torch._inductor.config``
    (all of TorchDynamo: half of a ``spml probe`` process on a GPU machine, ``python -X
    importtime``); its inductor flag matters to ``--compile`` only."""
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:  # a torch without the private setter: the public call
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    else:
        setter(mode, warn_only=warn_only)


def resolve_threads(step_threads: int | None, device: torch.device, shape: tuple[int, int, int],
                    batch: int, shared: bool, *, disk: bool = True) -> int | None:
    """CPU threads for the step loop (None: leave torch's setting); see
    :class:`probe.engine.speed.SpeedOptions`. ``step_threads`` None: :func:`measured_threads`."""
    if device.type != "cpu":
        return None
    if step_threads is not None:
        return step_threads
    return measured_threads(shape, batch, shared, disk=disk)


def measured_threads(shape: tuple[int, int, int], batch: int, shared: bool, *,
                     disk: bool = True) -> int | None:
    """1 or None (torch's setting) for a CPU step of heads ``shape`` (T, D+1, C) with
    ``batch`` rows: measured once per machine, step shape and torch thread setting, remembered
    in the process and (``disk``) the cache file (docs/design.md "Step threads decided once")."""
    default = torch.get_num_threads()
    if default <= 1:
        return None
    t, d1, c = shape
    key = f"step T={t} D+1={d1} C={c} batch={batch} shared={bool(shared)} threads={default}"
    return remembered_threads(key, lambda: _calibrate(shape, batch, shared, default), disk=disk)


def step_arithmetic(shape: tuple[int, int, int], batch: int, one_batch: bool,
                    device: str | torch.device = "cpu") -> Callable[[], None]:
    """A training step's arithmetic alone for heads ``shape`` (T, D+1, C) and ``batch`` rows:
    the float16 batch gather (one for every trial, ``one_batch``, else one per trial), the
    logits' product, ``Xᵀ·dZ`` and the stacked Adam update -- no loss, no autograd, no Python
    of the trainer. What the step-thread choice is measured on, and the floor
    ``spml bench replicates`` prints beside a run."""
    t, d1, c = shape
    g = torch.Generator().manual_seed(0)
    pool = torch.randn(4 * batch, d1, generator=g).half().to(device)
    w = torch.randn(t, d1, c, generator=g).mul_(0.01).to(device)
    dz = torch.randn(t, batch, c, generator=g).mul_(0.01).to(device)
    grad = torch.empty_like(w)
    opt = make_optimizer("adam", [TrialParam(w, 1e-4)])
    rows = torch.randint(0, 4 * batch, (1 if one_batch else t, batch), generator=g).to(device)

    def step() -> None:
        if one_batch:
            x = pool[rows[0]].float()
            torch.matmul(x, w).sigmoid_()
            torch.matmul(x.T, dz, out=grad)
        else:
            x = pool[rows].float()
            torch.bmm(x, w).sigmoid_()
            torch.bmm(x.transpose(1, 2), dz, out=grad)
        opt.step([grad])

    return step


def _calibrate(shape: tuple[int, int, int], batch: int, shared: bool, default: int
               ) -> tuple[int | None, dict]:
    """(the choice, the samples it was decided from): seconds per step on one thread and on
    ``default`` threads, alternately, until one is clearly faster (:func:`probe.engine.speed.
    clear_winner`) or five rounds ran (:func:`probe.engine.speed.choose_threads`)."""
    step = step_arithmetic(shape, batch, shared)

    def timed(threads: int, reps: int) -> float:
        with step_threads(torch.device("cpu"), threads):
            return timeit.timeit(step, number=reps) / reps

    timed(1, 2)
    timed(default, 2)  # warm both paths
    reps = max(2, min(50, int(0.02 / max(timed(1, 2), 1e-6))))  # ~20 ms per sample
    one: list[float] = []
    many: list[float] = []
    for _ in range(5):
        one.append(timed(1, reps))
        many.append(timed(default, reps))
        clear = clear_winner(one, many)
        if clear is not None:  # a clear winner is known in two rounds
            break
    if clear is None:  # no clear winner after every round: the measured choice
        choice = choose_threads(one, many)
    elif clear:  # one thread clearly faster
        choice = 1
    else:  # many threads clearly faster: the default
        choice = None
    return choice, {"seconds_per_step_one_thread": one,
                    f"seconds_per_step_{default}_threads": many,
                    "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def trial_blocks(n: int, state_bytes: int, device: torch.device, setting: int | None
                 ) -> list[range]:
    """Contiguous trial ranges trained one after the other through each epoch
    (:class:`BlockedTrainer`): ``setting`` (SpeedOptions.trial_block) trials per block, None =
    as many as keep ``state_bytes`` per trial within :data:`TRIAL_BLOCK_BYTES`, 0 = one block;
    balanced (sizes differ by at most one). One block off the CPU: a GPU wants every trial
    of a step in flight at once."""
    if device.type != "cpu" or setting == 0 or n <= 1:
        return [range(n)]
    size = setting if setting is not None else max(1, TRIAL_BLOCK_BYTES // max(1, state_bytes))
    k = -(-n // min(size, n))
    q, r = divmod(n, k)
    starts = [i * q + min(i, r) for i in range(k + 1)]  # the first r blocks hold q + 1
    return [range(starts[i], starts[i + 1]) for i in range(k)]


def make_trainer(data: ProbeData, config: ProbeConfig, plan: TrialPlan,
                 speed: SpeedOptions | None = None, draws: Tensor | None = None
                 ) -> StackedTrainer | BlockedTrainer:
    """The run's trainer: one :class:`StackedTrainer`, or a :class:`BlockedTrainer` where the
    trials train in several blocks (:func:`trial_blocks`; a given Loss object is never split)."""
    speed = speed or SpeedOptions()
    d1, c = data.train_x.shape[1], data.n_classes
    # float32 tensors per trial: head, gradient and the optimizer's state
    if config.optimizer == "adam":
        tensors = 4  # two moments
    elif config.momentum:
        tensors = 3  # SGD's momentum buffer
    else:
        tensors = 2
    blocks = (trial_blocks(plan.n, tensors * d1 * c * 4, data.device, speed.trial_block)
              if not (plan.given or config.compile) else [range(plan.n)])  # compile: once
    if len(blocks) == 1:
        return StackedTrainer(data, config, plan, speed, draws)
    return BlockedTrainer(data, config, plan, blocks, speed, draws)


def sync(device: torch.device) -> None:
    """Wait for the device (timing only; never inside an epoch)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StackedTrainer:
    """The training state of one run and its epoch (module docstring)."""

    def __init__(self, data: ProbeData, config: ProbeConfig, plan: TrialPlan,
                 speed: SpeedOptions | None = None, draws: Tensor | None = None) -> None:
        speed = speed or SpeedOptions()
        self.data, self.plan, self.device = data, plan, data.device
        self.n, self.batch = n, batch = data.n_train, plan.training.batch_size
        self.n_steps = n // batch if config.drop_last else -(-n // batch)
        self.flip = bool(config.flip and data.has_flip)
        # train targets: single positives, or the full labels as {1, -1} (the oracle)
        self.train_y = train_targets(data, config.labels)
        if plan.draw_index is not None:
            if draws is None:
                raise ProbeConfigError("the plan has per-trial draws but no draws were given")
            # (K, N, C): each distinct draw once on the device, whatever the number of trials
            self.train_y = draws
        # one loss object over per-trial draws: the live trials' draw numbers (T,), on the
        # device, from which each step gathers its (T, B, C) targets (_targets)
        self.draw_rows: Tensor | None = None
        if plan.stacked_draws:
            self.train_y = self.train_y.contiguous()  # flattened to (K·N, C) by each gather
            self.draw_rows = torch.tensor(plan.draw_index, dtype=torch.long, device=self.device)
        # per-trial folds: each live trial's first row of its fold's block in train_x (T,),
        # added to its batch rows at every gather (None: one train split)
        self.fold_start: Tensor | None = None
        if plan.fold_index is not None:
            self.fold_start = torch.tensor([k * plan.fold_rows for k in plan.fold_index],
                                           dtype=torch.long, device=self.device)
        self.groups: list[LossGroup] = setup_loss_groups(
            plan, self.train_y, self.device, features=self._unflipped_features())
        self.w = stacked_init(plan.seeds, data.train_x.shape[1], data.n_classes).to(self.device)
        self.grad_w = torch.empty_like(self.w)
        params = [TrialParam(self.w, plan.lr, plan.weight_decay)]
        for g in self.groups:
            lrs, ids = plan.lr[g.trials], range(plan.n)[g.trials]
            params += [TrialParam(p.data, [lr * mult for lr in lrs], 0.0, trial_ids=ids)
                       for p, mult in g.extra]
        self.opt = make_optimizer(config.optimizer, params, momentum=config.momentum,
                                  betas=config.betas, eps=config.eps)
        seeds = plan.seeds[:1] if plan.one_batch else plan.seeds
        self.order_gens = [order_generator(s) for s in seeds]
        self.extra_params = [p for g in self.groups for p, _ in g.extra]
        self.threads = resolve_threads(speed.step_threads, self.device, tuple(self.w.shape),
                                       batch, plan.one_batch, disk=speed.thread_cache)
        self.loss_sum = torch.zeros(plan.n, dtype=torch.float32, device=self.device)
        reason = self.graph_unavailable() if config.cuda_graph is not False else "off"
        if config.cuda_graph and reason:
            raise ProbeConfigError(
                f"--cuda-graph: the step cannot be captured ({reason}); leave the flag out "
                "(captured wherever it can be) or pass --no-cuda-graph")
        self.cuda_graph = reason is None
        # the run's trial id of each row of self.w (stopped trials leave: see stop())
        self.live: list[int] = list(range(plan.n))
        self._removed: dict[int, Tensor] = {}  # final heads of the trials that left, on CPU
        self.compiled = config.compile
        if self.compiled and (why := self.compile_unavailable()):
            self._skip_compile(why)
        if self.compiled:
            self._adam_hparams()
            self._traced = False
            self._count = torch.zeros((), dtype=torch.float32, device=self.device)
            # numbers as (T,) tensors: a schedule (GR's) then moves buffers in place each epoch
            # instead of baking new constants into a recompiled step
            for g, spec in [(grp, s) for grp in self.groups for s in grp.loss.hparam_specs]:
                v, t = g.loss.hparam(spec.name), len(range(plan.n)[g.trials])
                if spec.stackable and isinstance(v, float) and not plan.given:
                    g.loss.set_hparam(spec.name, torch.full((t,), v, device=self.device))
            self._compiled_step = torch.compile(self._fused_step, dynamic=False)

    def _unflipped_features(self) -> Tensor | list[Tensor]:
        """The train rows' unflipped features (N, D), no bias column: of the one train split,
        or per fold (a list, fold k's at k) -- what a loss with ``needs_features`` reads."""
        x = self.data.train_x
        if self.plan.fold_index is None:
            return x[: self.n, :-1]
        folds = x.shape[0] // self.plan.fold_rows
        return [x[k * self.plan.fold_rows : k * self.plan.fold_rows + self.n, :-1]
                for k in range(folds)]

    def _train_logits(self) -> Tensor:
        """(live trials, N, C) float32 logits of the unflipped train rows, each trial's own
        (its fold's, with per-trial folds): what the losses' epoch pass reads."""
        x = self.data.train_x
        if self.fold_start is None:
            return stacked_logits(x[: self.n], self.w)
        out = torch.empty(len(self.live), self.n, self.w.shape[2], device=self.device)
        for start, positions in positions_by_fold(self.fold_start.tolist()).items():
            mine = torch.tensor(positions, device=self.device)
            out[mine] = stacked_logits(x[start : start + self.n], self.w.index_select(0, mine))
        return out

    @property
    def needs_epoch_pass(self) -> bool:
        return any(g.loss.needs_epoch_pass for g in self.groups)

    def train_epoch(self, epoch: int) -> tuple[list[float], float]:
        """One epoch of every trial; returns (mean train loss per trial, seconds)."""
        t0 = time.perf_counter()
        for g in self.groups:
            g.loss.start_epoch(epoch)
        perm, rows = self._draw_order()
        self.loss_sum.zero_()
        with step_threads(self.device, self.threads):
            if self.cuda_graph:
                self._graph_epoch(perm, rows)
            else:
                for step in range(self.n_steps):
                    self._step(perm, rows, step)
        sync(self.device)
        means = dict(zip(self.live, (self.loss_sum / max(self.n_steps, 1)).tolist()))
        return [means.get(t) for t in range(self.plan.n)], time.perf_counter() - t0

    def end_epoch(self, epoch: int) -> float:
        """The losses' per-epoch pass over the train logits (EM+APL, LL-Cp, OPML); seconds."""
        t0 = time.perf_counter()
        if self.needs_epoch_pass:
            train_logits = self._train_logits()
            for g in self.groups:
                g.loss.end_epoch(epoch, train_logits[g.trials])
            del train_logits
            sync(self.device)
        return time.perf_counter() - t0

    @property
    def can_remove(self) -> bool:
        """Whether stopped trials leave the stacked model (every loss object of a shared
        order supports :meth:`~probe.losses.Loss.select_trials`; per-trial loss objects
        always do), else they are frozen in place."""
        return not self.plan.shared or all(g.loss.can_select_trials for g in self.groups)

    def stop(self, trials: list[int]) -> None:
        """Stop ``trials`` (run trial ids): they leave the stacked model -- their rows of the
        heads, of the optimizer state and of the losses' per-trial state -- so the later steps
        compute only the others, which continue exactly as before. Where a loss cannot drop
        trials (:attr:`can_remove`), their heads and optimizer state are frozen instead.

        "Exactly": on CPU bit for bit when the per-trial block B·C of the loss's elementwise
        kernels is a multiple of the vector width (COCO: 16·80) and, with several step threads,
        while two or more trials remain (vectorised tails, a one-matrix product's threads);
        otherwise to float rounding."""
        stop = {int(t) for t in trials}
        if not self.can_remove:
            self.opt.stop_trials(stop)
            return
        keep = [j for j, t in enumerate(self.live) if t not in stop]
        if len(keep) == len(self.live):
            return
        self._removed.update({t: self.w[j].detach().cpu().clone()
                              for j, t in enumerate(self.live) if t in stop})
        self.live = [self.live[j] for j in keep]
        if not keep:
            return  # nothing left to train; final_heads() has every head
        self.w = trial_rows(self.w, keep)
        self.grad_w = torch.empty_like(self.w)
        if self.fold_start is not None:  # the kept trials' folds
            self.fold_start = trial_rows(self.fold_start, keep)
        if self.plan.shared:
            g = self.groups[0]
            g.loss.select_trials(keep)
            if self.draw_rows is not None:  # the kept trials' draws
                self.draw_rows = trial_rows(self.draw_rows, keep)
            self.groups = [LossGroup(g.loss, slice(0, len(keep)), list(g.loss.extra_parameters()))]
            if not self.plan.one_batch:  # the kept trials' batch orders
                self.order_gens = [self.order_gens[j] for j in keep]
        else:
            self.groups = [LossGroup(self.groups[j].loss, slice(i, i + 1), self.groups[j].extra,
                                     self.groups[j].targets)
                           for i, j in enumerate(keep)]
            self.order_gens = [self.order_gens[j] for j in keep]
        self.extra_params = [p for g in self.groups for p, _ in g.extra]
        self.opt.select_trials(self.live, [self.w, *(p.data for p in self.extra_params)])
        self.loss_sum = torch.zeros(len(keep), dtype=torch.float32, device=self.device)
        if self.compiled:
            self._adam_hparams()
        # the thread setting stays the run's: a matrix product's rounding can depend on it

    @property
    def block_sizes(self) -> list[int]:
        """Trials per block: this trainer is one block of the run's trials."""
        return [self.plan.n]

    def final_heads(self) -> Tensor:
        """(T, D+1, C) on the CPU: every trial's head now (a removed trial's as it left)."""
        out = torch.empty(self.plan.n, *self.w.shape[1:], dtype=self.w.dtype)
        for t, w in self._removed.items():
            out[t] = w
        if self.live:
            out[self.live] = self.w.detach().cpu()
        return out

    def graph_unavailable(self) -> str | None:
        """Why the step cannot be captured as a CUDA graph here (None: it can)."""
        if self.device.type != "cuda":
            return f"the run is on {self.device}, CUDA graphs need a CUDA device"
        if not hasattr(torch.cuda, "CUDAGraph"):
            return "this torch build has no torch.cuda.CUDAGraph"
        if not (isinstance(self.opt, StackedAdam) and self.opt.fused):
            # SGD's first-step branch and unfused Adam's bias corrections are host values
            return "only the fused Adam update keeps its step count on the device"
        host = [g.loss.name for g in self.groups if g.loss.host_per_step]
        if host:
            return f"the {host[0]} loss draws on the host every step"
        return None

    def _graph_epoch(self, perm: Tensor, rows: Tensor) -> None:
        """One epoch as docs/design.md "The step as a CUDA graph" says, captured afresh every
        epoch (a loss may read its epoch as a host number)."""
        b, n_full = self.batch, self.n // self.batch
        warm = min(3, self.n_steps)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for step in range(warm):
                self._step(perm, rows, step)
        torch.cuda.current_stream(self.device).wait_stream(side)
        k = min(GRAPH_STEPS, max(n_full - warm, 0))
        done = warm
        if k:
            static_perm = perm[:, warm * b : (warm + k) * b].clone()
            static_rows = rows[:, warm * b : (warm + k) * b].clone()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for step in range(k):
                    self._step(static_perm, static_rows, step)
            while done + k <= n_full:
                static_perm.copy_(perm[:, done * b : (done + k) * b])
                static_rows.copy_(rows[:, done * b : (done + k) * b])
                graph.replay()
                done += k
        for step in range(done, self.n_steps):
            self._step(perm, rows, step)

    def _draw_order(self) -> tuple[Tensor, Tensor]:
        """This epoch's visiting order of every order stream, moved to the device once."""
        draws = [epoch_order(gen, self.n, self.flip) for gen in self.order_gens]
        perm, rows = (torch.stack(column) for column in zip(*draws))
        if self.device.type == "cuda":
            perm, rows = perm.pin_memory(), rows.pin_memory()
        return perm.to(self.device, non_blocking=True), rows.to(self.device, non_blocking=True)

    def _step(self, perm: Tensor, rows: Tensor, step: int) -> None:
        """One optimizer step of every trial on batch ``step``."""
        sl = slice(step * self.batch, (step + 1) * self.batch)
        if self.compiled:
            # contiguous: as the CUDA graph's static buffers (no recompile inside a capture)
            try:
                return self._compiled_step(perm[:, sl].contiguous(), rows[:, sl].contiguous())
            except Exception as e:  # dynamo cannot trace the loss: eager from the first step
                if self._traced or not type(e).__module__.startswith("torch._"):
                    raise
                self._skip_compile(f"torch.compile failed: {str(e).splitlines()[0]}")
            finally:
                self._traced = True
        x, z, idx = self._forward(perm[:, sl], rows[:, sl])
        per_trial, grads = self._loss_grads(z, idx)
        # dL/dW = Xᵀ dL/dZ per trial: one matrix product instead of autograd
        if self.plan.one_batch:
            torch.matmul(x.T, grads[0], out=self.grad_w)
        else:
            torch.bmm(x.transpose(1, 2), grads[0], out=self.grad_w)
        self.opt.step([self.grad_w, *grads[1:]])
        self.loss_sum += per_trial.detach().reshape(len(self.live))

    def _forward(self, perm: Tensor, rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The batch's features ``x``, logits ``z`` (T, B, C) and train-row indices.

        Rows are gathered by ``index_select``, the same values as ``train_x[rows]`` in about
        half the time on the CPU (COCO: 8 vs 21 µs per batch of 16 rows)."""
        feats = self.data.train_x
        if self.plan.one_batch:
            x = feats.index_select(0, rows[0]).float()
            return x, torch.matmul(x, self.w), perm[0]  # (B, D+1) @ (T, D+1, C)
        if self.fold_start is not None:  # each trial's rows of its own fold's block
            rows = rows + self.fold_start.view(-1, 1)
        x = feats.index_select(0, rows.reshape(-1)).view(*rows.shape, -1).float()
        return x, torch.bmm(x, self.w), perm  # (T, B, D+1) @ (T, D+1, C)

    def _loss_grads(self, z: Tensor, idx: Tensor) -> tuple[Tensor, tuple[Tensor | None, ...]]:
        """Per-trial losses (T,) and their gradients w.r.t. the logits and the loss's own
        parameters (autograd sees the loss only, not the head)."""
        z.requires_grad_(True)
        with torch.enable_grad():
            per_trial = self._losses(z, idx)
            grads = torch.autograd.grad(per_trial.sum(), [z, *self.extra_params],
                                        allow_unused=True)
        return per_trial, grads

    def _losses(self, z: Tensor, idx: Tensor) -> Tensor:
        """Per-trial losses (T,) of the logits ``z`` of the batch rows ``idx``: ``(B,)`` for one
        batch order, else ``(T, B)``, each trial's own."""
        if self.plan.shared:
            return self.groups[0].loss(z, self._targets(idx), index=idx).loss
        return torch.cat([g.loss(z[g.trials], g.targets[idx[g.trials.start]],
                                 index=idx[g.trials.start]).loss.reshape(1)
                          for g in self.groups])

    def _targets(self, idx: Tensor) -> Tensor:
        """The shared loss object's targets of the batch rows ``idx``: ``(B, C)`` for one batch
        and one set of targets; else ``(T, B, C)``, trial t's rows ``idx`` (or its own
        ``idx[t]``) of its own draw, gathered from the draws held once (no host
        synchronisation, so a CUDA graph captures it)."""
        if self.draw_rows is None:
            return self.train_y[idx]  # (B, C), or (T, B, C) for each trial's own batch
        if idx.ndim == 1:  # one batch order: every trial's rows are idx
            idx = idx.view(1, -1).expand(self.draw_rows.shape[0], -1)
        return per_trial_rows(self.train_y, idx, of=self.draw_rows)  # train_y: (K, N, C)

    def compile_unavailable(self) -> str | None:
        """Why the step cannot run through ``torch.compile`` here (None: it can)."""
        if why := inductor_unavailable(self.device):
            return why
        if not isinstance(self.opt, StackedAdam):
            return "only the Adam update is compiled"
        odd = [g.loss.name for g in self.groups
               if g.extra or g.loss.stateful or g.loss.host_per_step]
        if odd or not self.can_remove:
            return (f"the {(odd or [self.groups[0].loss.name])[0]} loss keeps state across "
                    "steps (per-example state, its own parameters, host draws or frozen trials)")
        return None

    def _skip_compile(self, reason: str) -> None:
        self.compiled = False
        warnings.warn(f"--compile: the eager step runs instead ({reason})", RuntimeWarning,
                      stacklevel=3)

    def _adam_hparams(self) -> None:
        """The live trials' Adam lr and weight decay as (T, 1, 1) tensors for the fused step."""
        self._lr, self._wd = (torch.tensor([v[t] for t in self.live], dtype=torch.float32)
                              .view(-1, 1, 1).to(self.device)
                              for v in (self.plan.lr, self.plan.weight_decay))

    def _fused_step(self, perm: Tensor, rows: Tensor) -> None:
        """The eager step as one traced function for inductor to fuse (docs/performance.md,
        the compiled step): the loss's gradient by ``torch.func.grad`` (dynamo does not trace
        autograd's engine), ``dW = Xᵀ·dZ``, and Adam with the step count on the device."""
        x, z, idx = self._forward(perm, rows)

        def total(z: Tensor) -> tuple[Tensor, Tensor]:
            per_trial = self._losses(z, idx)
            return per_trial.sum(), per_trial

        dz, per_trial = torch.func.grad(total, has_aux=True)(z)
        g = torch.matmul(x.T, dz) if self.plan.one_batch else torch.bmm(x.transpose(1, 2), dz)
        g = g + self._wd * self.w
        (b1, b2), m, v = self.opt.betas, self.opt.exp_avg[0], self.opt.exp_avg_sq[0]
        self._count.add_(1.0)
        m.lerp_(g, 1.0 - b1)
        v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
        denom = (v.sqrt() / (1.0 - b2 ** self._count).sqrt()).add_(self.opt.eps)
        self.w.sub_(self._lr / (1.0 - b1 ** self._count) * m / denom)
        self.loss_sum += per_trial.detach().reshape(len(self.live))


class BlockedTrainer:
    """The stacked trials as blocks (:func:`trial_blocks`), one :class:`StackedTrainer` each,
    every block trained through the whole epoch before the next (docs/design.md "Trial blocks
    on the CPU"). It offers what train_probe uses of :class:`StackedTrainer`, over the run's
    trial ids. The step threads are chosen once, for the largest block, and shared by all."""

    def __init__(self, data: ProbeData, config: ProbeConfig, plan: TrialPlan,
                 blocks: list[range], speed: SpeedOptions | None = None,
                 draws: Tensor | None = None) -> None:
        speed = speed or SpeedOptions()
        self.plan, self.device = plan, data.device
        shape = (max(len(r) for r in blocks), data.train_x.shape[1], data.n_classes)
        self.threads = resolve_threads(speed.step_threads, self.device, shape,
                                       plan.training.batch_size, plan.one_batch,
                                       disk=speed.thread_cache)
        fixed = replace(speed, step_threads=self.threads or torch.get_num_threads())
        self.blocks = [(r, StackedTrainer(data, config, plan.subset(r), fixed, draws))
                       for r in blocks]
        first = self.blocks[0][1]
        self.n_steps, self.flip, self.cuda_graph = first.n_steps, first.flip, False
        self.compiled = False  # --compile trains every trial in one block (make_trainer)

    @property
    def block_sizes(self) -> list[int]:
        return [len(r) for r, _ in self.blocks]

    @property
    def live(self) -> list[int]:
        return [r.start + t for r, b in self.blocks for t in b.live]

    @property
    def w(self) -> Tensor:
        """(live trials, D+1, C): the heads of the trials still training, in trial order."""
        live = [b.w for _, b in self.blocks if b.live]
        if not live:  # every trial stopped: an empty (0, D+1, C) stack
            return self.blocks[0][1].w[:0]
        return torch.cat(live) if len(live) > 1 else live[0]

    def train_epoch(self, epoch: int) -> tuple[list[float | None], float]:
        runs = [(r, *b.train_epoch(epoch)) for r, b in self.blocks if b.live]
        per_trial: list[float | None] = [None] * self.plan.n
        for r, losses, _ in runs:
            per_trial[r.start : r.stop] = losses
        return per_trial, sum(s for _, _, s in runs)

    def end_epoch(self, epoch: int) -> float:
        return sum(b.end_epoch(epoch) for _, b in self.blocks if b.live)

    def stop(self, trials: list[int]) -> None:
        for r, b in self.blocks:
            mine = [int(t) - r.start for t in trials if int(t) in r]
            if mine:
                b.stop(mine)

    def final_heads(self) -> Tensor:
        return torch.cat([b.final_heads() for _, b in self.blocks])
