"""What every dataset adapter returns: the ordered images, full labels and class names of the
two protocol phases (docs/protocol.md "Pools"): the official train split (the train/val *pool*) and
the official val/test split (our *test* set)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from probe.errors import SpmlError


@dataclass(frozen=True)
class Phase:
    """One protocol phase, in the fixed order the protocol's generators walk."""

    image_ids: tuple[str, ...]  # stable ids (file stem, COCO id, …), unique within the dataset
    paths: tuple[Path, ...]  # image files (may not exist for feature-only imports)
    labels: np.ndarray  # (N, C) uint8 full ground truth, 1 = positive
    n_unlabeled: int = 0  # rows with no positive label (kept for NUS-WIDE, counted)
    # per (image, class) weights of the label-bias draws (probe.store.bias), from the dataset's
    # boxes: {"size": Σ object area, "location": Σ 1/distance of box centres from the image
    # centre}, each (N, C) float32; empty where the dataset has no boxes
    bias_weights: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.image_ids)
        if self.labels.ndim != 2 or self.labels.shape[0] != n or len(self.paths) != n:
            raise SpmlError(
                f"Phase: image_ids ({n}), paths ({len(self.paths)}) and labels "
                f"{self.labels.shape} must agree in the number of rows"
            )
        for kind, w in self.bias_weights.items():
            if np.shape(w) != self.labels.shape:
                raise SpmlError(f"Phase: bias weights {kind!r} must have the labels' shape "
                                f"{self.labels.shape}; got {np.shape(w)}")

    def __len__(self) -> int:
        return len(self.image_ids)


@dataclass(frozen=True)
class DatasetIndex:
    """A dataset as the protocol sees it: ``pool`` (official train) and ``test`` phases."""

    name: str  # "voc", "coco", "nus", "cub", or the user's name
    class_names: tuple[str, ...]
    pool: Phase
    test: Phase
    root: Path | None = None

    def __post_init__(self) -> None:
        c = len(self.class_names)
        for phase_name in ("pool", "test"):
            phase = getattr(self, phase_name)
            if phase.labels.shape[1] != c:
                raise SpmlError(
                    f"DatasetIndex '{self.name}': {phase_name} labels have "
                    f"{phase.labels.shape[1]} columns but there are {c} class names"
                )
