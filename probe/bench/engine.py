"""``spml bench probe``: seconds per epoch of the probe engine against a plain PyTorch loop.

On a cached COCO-shaped synthetic store (:func:`synthetic_store`) one run measures (docs/design.md
"What fast means", docs/performance.md):

(a) one GR trial, batch 16, Adam: the engine against :func:`plain_loop` (the same arrays, seed,
    batch order and flips), the final heads of both compared in the same run;
(b) the engine with T = 1, 8, 64 stacked GR trials (different ``w_T`` per trial, shared seed);
(c) peak memory of each run (CPU: peak RSS reset through ``/proc/self/clear_refs``; CUDA:
    ``torch.cuda.max_memory_allocated``);
(d) evaluation as the engine does it: val of all T heads and test once, timed apart;
(e) :func:`papers_loop`, one GR trial the way the SPML papers' released code runs a linear probe
    (a timing reference, not an equivalence check);
(f) with ``--compare-one-block`` (CPU) / ``--compare-eager`` (CUDA) each configuration also
    trained as one block / with the eager step, its heads compared with the engine's;
(g) with ``--profile`` each engine row also gets a ``torch.profiler`` summary of one more
    training epoch (:mod:`probe.profiling`), taken after its timed epochs.

Each configuration is timed alone in a fresh process (``isolate``; ``--in-process``: all in this
one). Times are medians over the measured epochs; the report names the machine, the threads and
the load average before and after, as the figures move with the load.
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from probe.bench.prior import synthetic_prior
from probe.devices import resolve_device
from probe.engine.config import ProbeConfig
from probe.engine.data import ProbeData
from probe.engine.loop import deterministic, epoch_order, make_trainer, order_generator
from probe.engine.results import environment_info, from_linear
from probe.engine.speed import SpeedOptions, cpu_model, default_cache_dir
from probe.engine.train import train_probe
from probe.engine.trials import plan_trials
from probe.errors import SpmlError, is_int, plain
from probe.evaluation.heads import evaluate_heads
from probe.evaluation.intervals import bootstrap_map
from probe.losses import available, create_loss, get_loss_class
from probe.profiling import TOP_OPERATORS, Profile, format_summary

__all__ = ["BenchConfig", "bench_bootstrap", "default_cache_dir", "format_report",
           "machine_info", "papers_loop", "plain_loop", "profile_epoch", "run_bench",
           "synthetic_store"]

COCO_TRAIN_ROWS = 65_665  # docs/protocol.md step 3: COCO 65,665 / 16,416 / test 40,137
COCO_TEST_FRACTION = 40_137 / 82_081  # test rows per pool row in COCO
# bump when the generator or the store format changes (the cache key includes it); 2: stores
# carry a CRC-32C per chunk
SYNTHETIC_VERSION = 2
TARGETS = {"cpu_one_trial_s_per_epoch": 2.5, "cpu_plain_loop_s_per_epoch_expected": 8.0,
           "h100_64_trials_s_per_epoch": 1.0}


@dataclass(frozen=True)
class BenchConfig:
    """What ``spml bench probe`` measures (defaults: the docs/design.md COCO setting)."""

    n_train: int = COCO_TRAIN_ROWS  # COCO's train split
    dim: int = 2048  # ResNet-50 pooled features
    n_classes: int = 80  # COCO
    batch_size: int = 16  # GR's COCO preset
    lr: float = 1e-5  # GR's COCO preset
    epochs: int = 3  # measured epochs per configuration; the median is reported
    trials: tuple[int, ...] = (1, 8, 64)  # stacked trial counts for (b)
    plain: bool = True  # also time the plain PyTorch loop (a)
    papers: bool = True  # also time the papers-style loop (e)
    papers_workers: int = 2  # DataLoader worker processes of (e) (the released codes use >= 2)
    device: str = "auto"  # CUDA when available, else CPU
    compare_eager: bool = False  # CUDA: also time the eager step (the engine replays CUDA graphs)
    compare_compiled: bool = False  # also time the step through torch.compile (--compile)
    compare_one_block: bool = False  # CPU: also time the trials trained as one block
    # (trial_block=0; the engine trains many COCO-sized heads in blocks that stay in cache)
    isolate: bool = True  # time each configuration alone, in a fresh process; False: in this one
    seed: int = 0  # init, batch order and the synthetic data
    cache_dir: str | None = None  # None: default_cache_dir()
    loss: str = "gr"  # the engine rows' loss (a synthetic prior for one that reads a prior)
    # also profile one more training epoch of each engine row, untimed (probe.profiling): where
    # a figure misses its target, the operators and kernels that take the time
    profile: bool = False

    def validate(self) -> None:
        for name, flag in (("n_train", "--rows"), ("dim", "--dim"), ("n_classes", "--classes"),
                           ("batch_size", "--batch-size"), ("epochs", "--epochs")):
            if not is_int(getattr(self, name), 1):
                raise SpmlError(f"bench: {flag} must be a positive integer; got "
                                f"{plain(getattr(self, name))}")
        if self.n_train < 8:
            raise SpmlError(f"bench: --rows must be at least 8; got {self.n_train}")
        if self.batch_size > self.n_train:
            raise SpmlError(f"bench: --batch-size {self.batch_size} is larger than the train split "
                            f"(--rows {self.n_train})")
        if self.compare_eager and resolve_device(self.device).type != "cuda":
            raise SpmlError(
                f"bench: compare_eager (--compare-eager) needs a CUDA device; the bench runs on "
                f"{resolve_device(self.device)} (pass --device cuda on a GPU machine)")
        if self.compare_one_block and resolve_device(self.device).type != "cpu":
            raise SpmlError(
                "bench: compare_one_block (--compare-one-block) times the CPU's trial blocks; "
                f"the bench runs on {resolve_device(self.device)} (pass --device cpu)")
        if self.loss not in available():
            raise SpmlError(f"bench: --loss {self.loss} is not a registered loss; choose one of "
                            f"'spml losses list' (e.g. gr, gpr, vlpl, em)")
        if not self.trials or any(t < 1 for t in self.trials):
            raise SpmlError(f"bench: --trials must be positive integers; got {plain(self.trials)}")


def synthetic_store(n_train: int = COCO_TRAIN_ROWS, dim: int = 2048, n_classes: int = 80, *,
                    seed: int = 0, cache_dir: str | Path | None = None,
                    progress: bool = True, name: str = "coco-synthetic") -> Path:
    """Path of a cached COCO-shaped synthetic store, built on first use.

    Zipf-like class popularity, 1 + Poisson(1.9) positives per image (COCO's ~2.9); float16
    features ``relu(0.5·y·P + 0.5·noise)`` with random class prototypes P, flips with a little
    more noise; the protocol's split gives ``n_train`` train rows, test rows in COCO's proportion.
    ``name`` is the store's dataset name: ``"coco"`` makes every loss train at its COCO paper
    preset (``spml bench table``); the default matches no preset.
    """
    from probe.store import StoreError, open_store, write_feature_store
    from probe.store.index import DatasetIndex, Phase

    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    named = "" if name == "coco-synthetic" else f"-{name}"
    path = root / (f"bench-coco-synthetic{named}-v{SYNTHETIC_VERSION}-n{n_train}-d{dim}"
                   f"-c{n_classes}-s{seed}.zarr")
    if path.exists():
        with contextlib.suppress(StoreError):  # incomplete (an interrupted build): rebuilt below
            open_store(path)
            return path
    n_pool = n_train  # the smallest pool whose protocol split (20% val, rounded) leaves n_train
    while n_pool - round(0.2 * n_pool) < n_train:  # (grows by 0 or 1 per row: meets every value)
        n_pool += 1
    n = n_pool + max(1, round(n_pool * COCO_TEST_FRACTION))  # + test rows in COCO's proportion
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, n_classes + 1) ** 0.8
    popularity /= popularity.sum()
    counts = np.clip(1 + rng.poisson(1.9, size=n), 1, n_classes)
    labels = np.zeros((n, n_classes), dtype=np.uint8)
    for i, k in enumerate(counts):
        labels[i, rng.choice(n_classes, size=k, replace=False, p=popularity)] = 1
    protos = rng.standard_normal((n_classes, dim), dtype=np.float32)
    feats = np.empty((n, dim), dtype=np.float16)
    flips = np.empty((n, dim), dtype=np.float16)
    for r0 in range(0, n, 8192):
        y = labels[r0 : r0 + 8192].astype(np.float32)
        base = 0.5 * (y @ protos) + 0.5 * rng.standard_normal((len(y), dim), dtype=np.float32)
        feats[r0 : r0 + 8192] = np.maximum(base, 0)
        noise = 0.1 * rng.standard_normal((len(y), dim), dtype=np.float32)
        flips[r0 : r0 + 8192] = np.maximum(base + noise, 0)
    ids = [f"syn{i:07d}" for i in range(n)]
    index = DatasetIndex(
        name=name, class_names=tuple(f"class_{c:02d}" for c in range(n_classes)),
        pool=Phase(tuple(ids[:n_pool]), tuple(Path(i) for i in ids[:n_pool]), labels[:n_pool]),
        test=Phase(tuple(ids[n_pool:]), tuple(Path(i) for i in ids[n_pool:]), labels[n_pool:]))
    provenance = {"backbone": "none (synthetic features)", "weights": "none", "transform": "none",
                  "source": f"probe.bench.engine.synthetic_store v{SYNTHETIC_VERSION} seed {seed}"}
    root.mkdir(parents=True, exist_ok=True)
    write_feature_store(path, index, feats, flips, provenance=provenance, dtype="float16",
                        overwrite=True, progress=progress)
    return path


def plain_loop(data: ProbeData, loss_name: str = "gr", hparams: dict[str, Any] | None = None, *,
               seed: int = 0, lr: float = 1e-5, epochs: int = 1, batch_size: int = 16,
               flip: bool = True) -> tuple[nn.Linear, list[float]]:
    """The plain PyTorch program the engine must equal (probe.engine.train's docstring): a
    ``DataLoader`` over the same arrays (sampler = the epoch's order, flips by row offset,
    ``drop_last``), ``nn.Linear`` seeded with ``torch.manual_seed(seed)``, ``torch.optim.Adam``,
    ``zero_grad/backward/step``. Returns the head and the seconds of each epoch."""
    n = data.n_train
    flip = flip and data.has_flip
    rows = 2 * n if flip else n  # row r: train row r % n, flipped when r >= n
    dataset = torch.utils.data.TensorDataset(data.train_x[:rows, :-1],
                                             data.train_observed.repeat(2, 1)[:rows],
                                             torch.arange(n).repeat(2)[:rows])
    torch.manual_seed(seed)
    head = nn.Linear(data.feature_dim, data.n_classes).to(data.device)
    loss = create_loss(loss_name, **(hparams or {})).to(data.device)
    loss.setup(data.train_observed, n_epochs=epochs)
    if loss.needs_features:  # the unflipped train rows, no bias column (Loss.set_features)
        loss.set_features(data.train_x[:n, :-1].float())
    loss.manual_seed([seed])
    groups = [{"params": list(head.parameters())}]
    groups += [{"params": [p], "lr": lr * m} for p, m in loss.extra_parameters()]
    opt = torch.optim.Adam(groups, lr=lr)
    gen = order_generator(seed)
    seconds = []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        loss.start_epoch(epoch)
        _, rows = epoch_order(gen, n, flip)
        for x, y, idx in torch.utils.data.DataLoader(dataset, batch_size=batch_size,
                                                     sampler=rows.tolist(), drop_last=True):
            x, y, idx = x.float().to(data.device), y.to(data.device), idx.to(data.device)
            out = loss(head(x), y, index=idx)
            opt.zero_grad()
            out.loss.backward()
            opt.step()
        if loss.needs_epoch_pass:
            with torch.no_grad():
                loss.end_epoch(epoch, head(data.train_x[:n, :-1].float()).unsqueeze(0))
        if data.device.type == "cuda":
            torch.cuda.synchronize(data.device)
        seconds.append(time.perf_counter() - t0)
    return head, seconds


class _Features(torch.utils.data.Dataset):
    """Float32 feature rows and their label rows, as the released codes' feature datasets."""

    def __init__(self, x: np.ndarray, y: np.ndarray, flipped: np.ndarray | None = None) -> None:
        self.x, self.y, self.flipped = x, y, flipped

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        x = self.x[i]
        if self.flipped is not None and np.random.random() < 0.5:  # per-worker numpy stream
            x = self.flipped[i]
        return torch.from_numpy(x), torch.from_numpy(self.y[i]), i


def _papers_map(scores: np.ndarray, targets: np.ndarray) -> float:
    """mAP as the released codes compute it: per-class ``average_precision_score``."""
    try:
        from sklearn.metrics import average_precision_score
    except ImportError:  # the same figure from probe.metrics (exact sklearn AP)
        from probe.metrics import mean_average_precision

        return float(mean_average_precision(torch.from_numpy(targets).bool(),
                                            logits=torch.from_numpy(scores)).map)
    aps = [average_precision_score(targets[:, c], scores[:, c]) if targets[:, c].any() else 0.0
           for c in range(targets.shape[1])]
    return 100.0 * float(np.mean(aps))


def papers_loop(data: ProbeData, loss_name: str = "gr", *, seed: int = 0, lr: float = 1e-5,
                epochs: int = 1, batch_size: int = 16, workers: int = 2) -> dict[str, Any]:
    """One trial trained and evaluated the way the SPML papers' code does it (module
    docstring (e)); returns per-epoch seconds of training and of the whole epoch, and mAPs."""
    n = data.n_train
    x = data.train_x[:n, :-1].float().cpu().numpy()
    flipped = data.train_x[n:, :-1].float().cpu().numpy() if data.has_flip else None
    observed = data.train_observed.cpu().numpy()
    splits = {"train": (x, data.train_labels.cpu().numpy()),
              "val": (data.val_x[:, :-1].float().cpu().numpy(), data.val_labels.cpu().numpy()),
              "test": (data.test_x[:, :-1].float().cpu().numpy(), data.test_labels.cpu().numpy())}
    torch.manual_seed(seed)
    head = nn.Linear(data.feature_dim, data.n_classes)
    loss = create_loss(loss_name)
    loss.setup(torch.from_numpy(observed), n_epochs=epochs)
    if loss.needs_features:
        loss.set_features(torch.from_numpy(x))
    loss.manual_seed([seed])
    opt = torch.optim.Adam(head.parameters(), lr=lr)
    train_loader = torch.utils.data.DataLoader(
        _Features(x, observed, flipped), batch_size=batch_size, shuffle=True, drop_last=True,
        num_workers=workers, generator=torch.Generator().manual_seed(seed),
        worker_init_fn=functools.partial(_seed_worker, seed), persistent_workers=workers > 0)
    eval_loaders = {k: torch.utils.data.DataLoader(_Features(xs, ys), batch_size=batch_size,
                                                   num_workers=workers)
                    for k, (xs, ys) in splits.items()}
    train_s, epoch_s, maps = [], [], []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        loss.start_epoch(epoch)
        head.train()
        for xb, yb, idx in train_loader:
            out = loss(head(xb), yb, index=idx)
            opt.zero_grad()
            out.loss.backward()
            opt.step()
        t1 = time.perf_counter()
        head.eval()
        with torch.no_grad():
            maps.append({k: _papers_map(np.concatenate([torch.sigmoid(head(xb)).numpy()
                                                        for xb, _, _ in loader]), splits[k][1])
                         for k, loader in eval_loaders.items()})
        train_s.append(t1 - t0)
        epoch_s.append(time.perf_counter() - t0)
    return {"train_seconds": train_s, "epoch_seconds": epoch_s, "maps": maps}


def _seed_worker(seed: int, worker: int) -> None:
    np.random.seed(seed + worker)


def machine_info() -> dict[str, Any]:
    """What the figures depend on: CPU model and count, torch threads, load average."""
    cpus = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 0)
    try:
        load = [round(v, 2) for v in os.getloadavg()]
    except OSError:
        load = []
    return {"cpu": cpu_model(), "cpus": cpus, "torch_threads": torch.get_num_threads(),
            "load_avg_1_5_15": load}


class _PeakMemory:
    """Peak memory of a block: CUDA allocator peak, or the process's peak RSS (VmHWM, reset
    through /proc/self/clear_refs; where that is not possible, the lifetime peak)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.kind = "cuda_max_allocated" if device.type == "cuda" else "peak_rss"
        self.peak = 0
        self.start = 0  # memory in use when the block began (allocated / resident)

    @staticmethod
    def _status(field: str) -> int:
        try:
            with open("/proc/self/status") as fh:
                for line in fh:
                    if line.startswith(field + ":"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    def __enter__(self) -> _PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = int(torch.cuda.memory_allocated(self.device))
        else:
            self.start = self._status("VmRSS")
            try:
                with open("/proc/self/clear_refs", "w") as fh:
                    fh.write("5")
            except OSError:
                self.kind = "lifetime_peak_rss"
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = int(torch.cuda.max_memory_allocated(self.device))
        else:
            self.peak = self._status("VmHWM")


def run_bench(config: BenchConfig | None = None, *, progress: bool = True) -> dict[str, Any]:
    """Measure (a)-(f) of the module docstring, each row alone in a fresh process with
    ``config.isolate``; returns the report (also the JSON)."""
    cfg = config or BenchConfig()
    cfg.validate()
    device = resolve_device(cfg.device)
    t0 = time.perf_counter()
    path = synthetic_store(cfg.n_train, cfg.dim, cfg.n_classes, seed=cfg.seed,
                           cache_dir=cfg.cache_dir, progress=progress)
    build_s = time.perf_counter() - t0
    cls = get_loss_class(cfg.loss)  # a loss that reads a prior gets a synthetic one
    prior = None if cls.prior is None else synthetic_prior(
        path, (*getattr(cls, "prior_extras", ()), *getattr(cls, "prior_optional", ())),
        seed=cfg.seed)
    data = ProbeData.from_store(path, device="cpu")  # the shape of what the jobs load
    store = {"path": str(path), "build_or_open_seconds": build_s, "prior": prior,
             "train_rows": data.n_train, "dim": data.feature_dim, "classes": data.n_classes,
             "flip": data.has_flip, "data_bytes_on_device": data.nbytes()}
    del data
    rows: list[dict[str, Any]] = []
    equivalence = None
    machine = {"before": machine_info()}
    run = functools.partial(_run_job, isolate=cfg.isolate, threads=torch.get_num_threads())
    plain, papers = cfg.plain and cfg.loss == "gr", cfg.papers and cfg.loss == "gr"
    for t in sorted(set(cfg.trials) | ({1} if plain else set())):
        engine = run(_engine_job, cfg, str(path), t, "engine", progress, prior)
        rows.append(engine["row"])
        for variant in _variants(cfg, engine["row"]):
            other = run(_engine_job, cfg, str(path), t, variant, progress, prior)
            against = "blocks" if variant == "engine_one_block" else "graph"
            other["row"][f"max_abs_diff_vs_{against}"] = float(
                np.abs(other["heads"] - engine["heads"]).max())
            rows.append(other["row"])
        if t == 1 and plain:
            plain_row = run(_plain_job, cfg, str(path))
            equivalence = float(np.abs(plain_row["heads"] - engine["heads"]).max())
            rows.append(plain_row["row"])
        if t == 1 and papers:
            rows.append(run(_papers_job, cfg, str(path))["row"])
    machine["after"] = machine_info()
    return {"config": asdict(cfg), "store": store, "environment": environment_info(device),
            "machine": machine, "rows": rows, "ratios": _ratios(rows, cfg),
            "equivalence_max_abs_diff_engine_vs_plain": equivalence, "targets": TARGETS}


def _ratios(rows: list[dict[str, Any]], cfg: BenchConfig) -> dict[str, float]:
    row = {(r["method"], r["trials"]): r for r in rows}  # one row per method and T
    by = {key: r["sec_per_epoch_median"] for key, r in row.items()}
    ratios: dict[str, float] = {}
    if ("plain", 1) in by and ("engine", 1) in by:
        ratios["plain_over_engine_1_trial"] = by[("plain", 1)] / by[("engine", 1)]
    if ("papers", 1) in by and ("engine", 1) in by:
        engine1, papers = row[("engine", 1)], row[("papers", 1)]
        ratios["papers_over_engine_1_trial_training"] = by[("papers", 1)] / by[("engine", 1)]
        # a whole epoch: what each does per epoch (the engine: train + val; test once / epochs)
        engine_whole = (engine1["sec_per_epoch_median"] + engine1["eval_seconds_val"]
                        + engine1["eval_seconds_test_once"] / cfg.epochs)
        ratios["papers_over_engine_1_trial_whole_epoch"] = (
            statistics.median(papers["whole_epoch_seconds"]) / engine_whole)
    for t in cfg.trials:
        if t > 1 and ("engine", 1) in by:
            ratios[f"engine_{t}_trials_over_1_trial"] = by[("engine", t)] / by[("engine", 1)]
        for method, key in _VARIANT_RATIOS:
            if (method, t) in by:
                ratios[key.format(t)] = by[(method, t)] / by[("engine", t)]
    return ratios


#: each variant's rows (f) and the name of its ratio to the engine's row of the same T
_VARIANT_RATIOS = (("engine_one_block", "one_block_over_blocks_{}_trials"),
                   ("engine_eager", "eager_over_cuda_graph_{}_trials"),
                   ("engine_compiled", "compiled_over_engine_{}_trials"))


def _variants(cfg: BenchConfig, engine_row: dict[str, Any]) -> list[str]:
    """The same run another way, timed beside the engine's (f)."""
    one_block = cfg.compare_one_block and len(engine_row["trial_blocks"]) > 1
    return (["engine_one_block"] * one_block + ["engine_eager"] * cfg.compare_eager
            + ["engine_compiled"] * cfg.compare_compiled)


def _run_job(job: Any, *args: Any, isolate: bool, threads: int) -> dict[str, Any]:
    """``job(*args)`` in a fresh spawned process (``isolate``) with this process's torch
    thread count, or here."""
    if not isolate:
        return job(*args)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                             initializer=torch.set_num_threads, initargs=(threads,)) as pool:
        return pool.submit(job, *args).result()


def _job_data(cfg: BenchConfig, path: str, prior: str | None = None) -> ProbeData:
    return ProbeData.from_store(path, device=resolve_device(cfg.device), priors=prior)


def _stacked_hparams(loss: str, t: int) -> list[dict[str, Any]]:
    """T values of one hyperparameter (the kind of spread an Optuna study stacks): GR's final
    w_T in [2, 10], else the loss's first searched stackable one over its search range."""
    if t == 1:
        return [{}]
    specs = {s.name: s for s in get_loss_class(loss).hparam_specs if s.stackable and s.search}
    if "w_T" in specs:
        return [{"w_T": float(w)} for w in np.linspace(2.0, 10.0, t)]
    if not specs:
        raise SpmlError(f"bench: --loss {loss} has no searched hyperparameter to stack; "
                        "use --trials 1")
    spec = next(iter(specs.values()))
    return [{spec.name: float(v)} for v in np.linspace(*spec.search, t)]


def _engine_job(cfg: BenchConfig, path: str, t: int, method: str, progress: bool,
                prior: str | None = None) -> dict[str, Any]:
    """(b) and (d) for T = ``t`` (``method`` "engine"), or the same run as one block
    ("engine_one_block") or with the eager step ("engine_eager"): its row and final heads."""
    data = _job_data(cfg, path, prior)
    pc = ProbeConfig(batch_size=cfg.batch_size, lr=cfg.lr, epochs=cfg.epochs, eval_every=0,
                     seed=cfg.seed, device=str(data.device),
                     cuda_graph=False if method == "engine_eager" else None, priors=prior,
                     compile=method == "engine_compiled")
    speed = SpeedOptions(trial_block=0 if method == "engine_one_block" else None)
    hparams = _stacked_hparams(cfg.loss, t)  # one shared seed
    with _PeakMemory(data.device) as mem:
        result = train_probe(data, pc, cfg.loss, hparams, progress=progress, speed=speed)
    heads = result.final_heads.to(data.device)
    blocks = result.timing.get("trial_blocks", [t])
    trials = f"{t} stacked {cfg.loss.upper()} trial{'s' if t > 1 else ''}"
    extra: dict[str, Any] = {}
    if method == "engine_one_block":
        name = f"engine, {trials} in one block"
    elif method in ("engine_eager", "engine_compiled"):
        if method == "engine_eager":
            step = "eager step (no CUDA graph)"
        elif result.timing["compiled"]:
            step = "compiled step (torch.compile)"
        else:  # asked for a compiled step, but torch.compile was unavailable here
            step = "compiled step (not compiled: eager)"
        name = f"engine, {step}, {trials}"
        extra.update(compiled=result.timing["compiled"], cuda_graph=result.timing["cuda_graph"])
    else:
        with torch.no_grad():  # what the engine evaluates: val every epoch, test once
            for key, x, y in (("eval_seconds_val", data.val_x, data.val_labels),
                              ("eval_seconds_test_once", data.test_x, data.test_labels)):
                t_eval = time.perf_counter()
                evaluate_heads(x, y.bool(), heads, 0.5)
                extra[key] = time.perf_counter() - t_eval
        kind = "engine (CUDA graphs)" if result.timing.get("cuda_graph") else "engine"
        in_blocks = f" in {len(blocks)} blocks" if len(blocks) > 1 else ""
        name = f"{kind}, {trials}{in_blocks}"
        extra.update(step_threads=result.timing.get("step_threads"),
                     cuda_graph=result.timing.get("cuda_graph"))
    if cfg.profile:
        extra["profile"] = profile_epoch(data, pc, cfg.loss, hparams, speed)
    row = _row(name, method, t, result.timing["train_seconds"], mem,
               result.timing["steps_per_epoch"], **extra, trial_blocks=blocks)
    return {"row": row, "heads": heads.cpu().numpy()}


def profile_epoch(data: ProbeData, config: ProbeConfig, loss: str,
                  hparams: list[dict[str, Any]], speed: SpeedOptions | None = None,
                  top: int = TOP_OPERATORS) -> dict[str, Any]:
    """A :class:`probe.profiling.Profile` summary of one training epoch of ``train_probe``'s
    run (no evaluation): the second epoch of a fresh trainer, as the first captures the CUDA
    graphs, compiles the step and fills the caches."""
    plan = plan_trials(data, config, loss, hparams)
    trainer = make_trainer(data, config, plan, speed)
    # as train_probe runs it: CUDA's deterministic kernels where the config asks for them
    with deterministic(trainer.device, config.deterministic), torch.no_grad():
        trainer.train_epoch(0)
        with Profile(data.device, top) as prof:
            trainer.train_epoch(1)
    return prof.summary or {}


def _plain_job(cfg: BenchConfig, path: str) -> dict[str, Any]:
    """(a): the plain loop's row and its head as a stacked (1, D+1, C) array."""
    data = _job_data(cfg, path)
    with _PeakMemory(data.device) as mem:
        head, secs = plain_loop(data, "gr", seed=cfg.seed, lr=cfg.lr, epochs=cfg.epochs,
                                batch_size=cfg.batch_size)
    return {"row": _row("plain loop (DataLoader + nn.Linear + torch.optim.Adam), 1 GR trial",
                        "plain", 1, secs, mem, data.n_train // cfg.batch_size),
            "heads": from_linear(head).cpu()[None].numpy()}


def _papers_job(cfg: BenchConfig, path: str) -> dict[str, Any]:
    """(e): the papers-style loop's row."""
    data = _job_data(cfg, path)
    with _PeakMemory(data.device) as mem:
        pl = papers_loop(data, "gr", seed=cfg.seed, lr=cfg.lr, epochs=cfg.epochs,
                         batch_size=cfg.batch_size, workers=cfg.papers_workers)
    name = (f"papers-style loop ({cfg.papers_workers} DataLoader workers, mAP of 3 splits/epoch), "
            "1 trial")
    return {"row": _row(name, "papers", 1, pl["train_seconds"], mem,
                        data.n_train // cfg.batch_size, whole_epoch_seconds=pl["epoch_seconds"],
                        maps=pl["maps"])}


def _row(name: str, method: str, t: int, secs: list[float], mem: _PeakMemory, steps: int,
         **extra: Any) -> dict[str, Any]:
    """A report row of one run of ``t`` trials (``extra``: its own fields)."""
    return {"name": name, "method": method, "trials": t,
            "sec_per_epoch_median": statistics.median(secs),
            "sec_per_epoch_per_trial": statistics.median(secs) / t,
            "epoch_seconds": secs, "eval_seconds_val": None, "eval_seconds_test_once": None,
            **extra, "steps_per_epoch": steps,
            "peak_memory_bytes": mem.peak, "memory_at_start_bytes": mem.start,
            "memory_kind": mem.kind}


def format_report(report: dict[str, Any]) -> str:
    """The report as a text table (what ``spml bench probe`` prints before the JSON)."""
    env, store = report["environment"], report["store"]
    before, after = (report.get("machine", {}).get(k, {}) for k in ("before", "after"))
    lines = [
        f"probe bench on {env['device']} ({before.get('cpu', env['device_name'])}, "
        f"{before.get('cpus', '?')} CPUs, {env['threads']} torch threads), torch {env['torch']}",
        f"load average (1, 5, 15 min) before {before.get('load_avg_1_5_15')} after "
        f"{after.get('load_avg_1_5_15')}: figures move with the load",
        f"store: {store['train_rows']} train rows x {store['dim']}, {store['classes']} classes, "
        f"flip={store['flip']}; batch {report['config']['batch_size']}, Adam, "
        f"{report['config'].get('loss', 'gr')} loss"
        + (f" (synthetic prior {store['prior']})" if store.get("prior") else "")
        + ("; plain and papers loops: GR only" if report['config'].get('loss', 'gr') != "gr"
           else "") + "; "
        f"median of {report['config']['epochs']} epochs; "
        + ("each row timed alone, in a fresh process" if report["config"].get("isolate", True)
           else "rows timed one after the other in one process (--in-process)"),
        "",
        f"{'configuration (s/epoch: training)':<72} {'s/epoch':>9} {'s/epoch/trial':>14} "
        f"{'val s':>7} {'test s':>7} {'peak MiB':>9} {'+MiB':>7}"]
    for r in report["rows"]:  # +MiB: peak minus what was in use when the run began
        val = "-" if r["eval_seconds_val"] is None else f"{r['eval_seconds_val']:.2f}"
        test = "-" if r["eval_seconds_test_once"] is None else f"{r['eval_seconds_test_once']:.2f}"
        lines.append(
            f"{r['name']:<72} {r['sec_per_epoch_median']:>9.3f} "
            f"{r['sec_per_epoch_per_trial']:>14.4f} {val:>7} {test:>7} "
            f"{r['peak_memory_bytes'] / 2**20:>9.0f} "
            f"{(r['peak_memory_bytes'] - r['memory_at_start_bytes']) / 2**20:>7.0f}")
    if report["ratios"]:
        lines.append("")
        lines += [f"{k}: {v:.2f}" for k, v in report["ratios"].items()]
    for r in report["rows"]:
        for against, what in (("blocks", "the blocks"), ("graph", "the CUDA graph run")):
            if f"max_abs_diff_vs_{against}" in r:
                lines.append(f"{r['name']}: max |head difference| vs {what} "
                             f"{r[f'max_abs_diff_vs_{against}']:.2e}")
    eq = report["equivalence_max_abs_diff_engine_vs_plain"]
    if eq is not None:
        lines.append(f"engine vs plain loop, max |head difference| after the run: {eq:.2e}")
    for r in report["rows"]:
        if r.get("profile"):
            lines += ["", *format_summary(r["profile"], f"one more epoch, {r['name']}")]
    return "\n".join(lines)


def bench_bootstrap(n: int = 40_137, c: int = 80, systems: int = 1, n_resamples: int = 1000,
                    repeats: int = 3, device: str = "cpu", seed: int = 0) -> dict:
    """``spml bench intervals``: seconds for :func:`bootstrap_map` on random scores of a
    COCO-sized test set (N x C, 3% positives), the median of ``repeats`` runs, with the machine
    and its load before and after (probe.bench.engine.machine_info)."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(systems, n, c, generator=gen).to(device)
    targets = (torch.rand(n, c, generator=gen) < 0.03).to(device)
    before = machine_info()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        bootstrap_map(scores, targets, n_resamples=n_resamples, seed=seed)
        if scores.is_cuda:
            torch.cuda.synchronize(scores.device)
        runs.append(time.perf_counter() - t0)
    return {"n": n, "classes": c, "systems": systems, "n_resamples": n_resamples,
            "device": str(device), "seconds": runs, "median_seconds": sorted(runs)[len(runs) // 2],
            "machine_before": before, "load_after": machine_info()["load_avg_1_5_15"]}
