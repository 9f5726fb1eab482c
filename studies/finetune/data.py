"""The fine-tune's data (:mod:`studies.finetune.run` runs it): the protocol's three splits of a
dataset, the image loader (the backbone's transform up to the normalisation, in DataLoader
workers), the device-side normalisation and flips, and each epoch's seeded batch order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from studies.finetune.config import FinetuneConfig, FinetuneError


@dataclass
class FinetuneData:
    """The protocol's three splits of one dataset (docs/protocol.md steps 1-4)."""

    name: str
    class_names: tuple[str, ...]
    train_paths: list[str]
    val_paths: list[str]
    test_paths: list[str]
    observed_train: np.ndarray  # (N_train, C) int8 single positives
    val_targets: np.ndarray  # (N_val, C) uint8, clean or observed positives
    test_targets: np.ndarray  # (N_test, C) uint8 clean
    val_clean: np.ndarray  # (N_val, C) uint8 (for k)

    def summary(self) -> dict[str, Any]:
        return {
            "dataset": self.name, "n_classes": len(self.class_names),
            "class_names": list(self.class_names), "n_train": len(self.train_paths),
            "n_val": len(self.val_paths), "n_test": len(self.test_paths),
            "n_train_without_positive": int((self.observed_train != 1).all(axis=1).sum()),
        }


def load_data(config: FinetuneConfig) -> FinetuneData:
    """The dataset's images and labels split by the protocol (train/val/test), with the
    single positives of ``config.observed_seed``; refuses an empty test or val split."""
    from featurize.datasets import load_dataset
    from probe.store.protocol import single_positive, split_pool

    root = Path(config.root).expanduser()
    index = load_dataset(config.dataset, root, **dict(config.dataset_options))
    pool, test = index.pool, index.test
    if len(test) == 0:
        raise FinetuneError(f"finetune: dataset '{index.name}' at {root} has no test images")
    train_idx, val_idx = split_pool(len(pool))
    if len(val_idx) == 0:
        raise FinetuneError(
            f"finetune: dataset '{index.name}' at {root} has only {len(pool)} pool images: "
            "the 20% validation split is empty; need at least 3"
        )
    observed_pool = single_positive(pool.labels, config.observed_seed)
    val_targets = (pool.labels[val_idx] if config.val_labels == "clean"
                   else (observed_pool[val_idx] == 1).astype(np.uint8))
    return FinetuneData(
        name=index.name, class_names=tuple(index.class_names),
        train_paths=[str(pool.paths[i]) for i in train_idx],
        val_paths=[str(pool.paths[i]) for i in val_idx], test_paths=[str(p) for p in test.paths],
        observed_train=observed_pool[train_idx],
        val_targets=np.ascontiguousarray(val_targets, dtype=np.uint8),
        test_targets=np.ascontiguousarray(test.labels, dtype=np.uint8),
        val_clean=np.ascontiguousarray(pool.labels[val_idx], dtype=np.uint8),
    )


class _Images(torch.utils.data.Dataset):
    """Row ``i`` → ``((S, S, 3) uint8 tensor, i)``: the reference pipeline up to the resize.

    Channels-last on purpose: ``batch.permute(0, 3, 1, 2)`` on the device is then already in
    ``torch.channels_last`` layout. Normalisation and flips happen on the device.
    """

    def __init__(self, paths: list[str], transform: Any) -> None:
        self.paths, self.transform = paths, transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        from featurize.extract.images import pil_transformed

        return torch.from_numpy(pil_transformed(self.paths[i], self.transform).copy()), i


def make_loader(plan: Any, paths: list[str], batches: list[list[int]]):
    """A DataLoader over fixed batches of rows. It gets its own generator, so creating one
    never draws from the global RNG (which a resumed run must find as it was saved)."""
    return torch.utils.data.DataLoader(
        _Images(paths, plan.transform), batch_sampler=batches, num_workers=plan.num_workers,
        pin_memory=plan.device.type == "cuda", generator=torch.Generator().manual_seed(0),
        prefetch_factor=4 if plan.num_workers else None)


class FinetuneInputs:
    """uint8 ``(B, S, S, 3)`` host batch → normalised float model input on the device."""

    def __init__(self, plan: Any) -> None:
        spec = plan.transform  # its mean and std: the weights' own
        self.device = plan.device
        self.mean = torch.tensor(spec.mean, device=plan.device).view(1, 3, 1, 1)
        self.std = torch.tensor(spec.std, device=plan.device).view(1, 3, 1, 1)
        self.fmt = torch.channels_last if plan.channels_last else torch.contiguous_format

    def __call__(self, batch: Tensor, flip: Tensor | None = None) -> Tensor:
        x = batch.to(self.device, non_blocking=True).permute(0, 3, 1, 2)
        if flip is not None:
            x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
        # the arithmetic of ToTensor + Normalize: x / 255, then (x - mean) / std
        x = x.contiguous(memory_format=self.fmt).float().div_(255.0)
        return x.sub_(self.mean).div_(self.std)


def epoch_order(seed: int, epoch: int, n: int, steps: int, bs: int) -> tuple[Tensor, Tensor]:
    """Epoch ``epoch``'s batches ``(steps, bs)`` of train rows and per-row flip bits ``(n,)``."""
    state = np.random.SeedSequence([int(seed), int(epoch)]).generate_state(2, dtype=np.uint32)
    gen = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
    perm = torch.randperm(n, generator=gen)
    flips = torch.rand(n, generator=gen) < 0.5
    return perm[: steps * bs].view(steps, bs), flips
