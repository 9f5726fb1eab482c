"""docs/protocol.md steps 2-3 against an independent re-implementation written from the spec
text."""

from __future__ import annotations

import numpy as np
import pytest

from probe.store.protocol import single_positive, split_indices, split_pool


def _reference_single_positive(y: np.ndarray, seed: int) -> np.ndarray:
    """Cole et al.'s observe_uniform(num_pos=1, num_neg=0) on the -1/+1 matrix, as in the spec."""
    signed = y.astype(np.float64).copy()
    signed[signed == 0] = -1
    rng = np.random.RandomState(seed)
    out = np.zeros_like(signed)
    for i in range(signed.shape[0]):
        idx = np.nonzero(signed[i, :] == 1.0)[0]
        rng.shuffle(idx)
        out[i, idx[:1]] = 1.0
        idx = np.nonzero(signed[i, :] == -1.0)[0]
        rng.shuffle(idx)
        out[i, idx[:0]] = -1.0
    return out


def _reference_split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    n_2 = int(np.round(0.2 * n))
    perm = np.random.RandomState(seed).permutation(n)
    return np.sort(perm[: n - n_2]), np.sort(perm[-n_2:])


@pytest.fixture
def labels() -> np.ndarray:
    rng = np.random.default_rng(0)
    y = (rng.random((300, 17)) < 0.15).astype(np.uint8)
    y[::7] = 0  # rows without a positive (as in NUS-WIDE)
    y[5] = 1  # a row with every class positive
    return y


@pytest.mark.parametrize("seed", [1200, 1, 77])
def test_single_positive_matches_reference(labels: np.ndarray, seed: int) -> None:
    ours = single_positive(labels, seed)
    ref = _reference_single_positive(labels, seed)
    assert ours.dtype == np.int8 and ours.shape == labels.shape
    np.testing.assert_array_equal(ours, ref.astype(np.int8))


def test_single_positive_properties(labels: np.ndarray) -> None:
    obs = single_positive(labels)
    has_pos = labels.sum(1) > 0
    assert (obs.sum(1)[has_pos] == 1).all()
    assert (obs.sum(1)[~has_pos] == 0).all()
    assert set(np.unique(obs)) <= {0, 1}
    assert (labels[obs == 1] == 1).all()  # the observed positive is a true positive


def test_single_positive_consumes_negative_shuffle(labels: np.ndarray) -> None:
    """Skipping the negative shuffle changes later rows: the spec's RNG consumption matters."""
    rng = np.random.RandomState(1200)
    skipped = np.zeros(labels.shape, dtype=np.int8)
    for i in range(labels.shape[0]):
        pos = np.nonzero(labels[i] == 1)[0]
        rng.shuffle(pos)
        skipped[i, pos[:1]] = 1
    assert not np.array_equal(skipped, single_positive(labels))


def test_single_positive_is_reseeded_per_call(labels: np.ndarray) -> None:
    """Per phase re-seeding: the draw for a phase does not depend on what ran before it."""
    first = single_positive(labels[:100])
    single_positive(labels[100:])
    np.testing.assert_array_equal(first, single_positive(labels[:100]))
    assert not np.array_equal(single_positive(labels, 1200), single_positive(labels, 1201))


def test_single_positive_rejects_1d() -> None:
    with pytest.raises(ValueError, match="2-D"):
        single_positive(np.zeros(5, dtype=np.uint8))


@pytest.mark.parametrize("n", [1, 2, 7, 10, 333, 1000])
def test_split_pool_matches_reference(n: int) -> None:
    train, val = split_pool(n)
    ref_train, ref_val = _reference_split(n, 1200)
    np.testing.assert_array_equal(train, ref_train)
    if int(np.round(0.2 * n)) > 0:
        np.testing.assert_array_equal(val, ref_val)
    else:  # the reference's perm[-0:] would be everything; a zero-size val is what 20% means
        assert val.size == 0
    assert train.dtype == np.int64 and val.dtype == np.int64
    assert np.intersect1d(train, val).size == 0
    np.testing.assert_array_equal(np.union1d(train, val), np.arange(n))
    assert (np.diff(train) > 0).all() and (np.diff(val) > 0).all()


@pytest.mark.parametrize(
    ("pool", "train", "val"),
    [
        (5717, 4574, 1143),  # VOC 2012
        (82081, 65665, 16416),  # COCO 2014
        (150000, 120000, 30000),  # NUS-WIDE
        (5994, 4795, 1199),  # CUB-200-2011
    ],
)
def test_protocol_sizes(pool: int, train: int, val: int) -> None:
    """docs/protocol.md step 3 sizes, from the arithmetic alone."""
    n_val = int(np.round(0.2 * pool))
    assert (pool - n_val, n_val) == (train, val)


def test_split_pool_sizes_coco() -> None:
    train, val = split_pool(82081)
    assert (train.size, val.size) == (65665, 16416)


def test_split_indices_arguments() -> None:
    first, second = split_indices(10, 0.3, seed=5)
    assert (first.size, second.size) == (7, 3)
    with pytest.raises(ValueError, match="fraction"):
        split_indices(10, 1.0)
    with pytest.raises(ValueError, match="n must be"):
        split_indices(-1, 0.2)
