"""Studies under load and bad input (issue 15): search spaces checked against each
hyperparameter's valid range before anything is created; many workers started at the same
instant on one journal file and on one fresh PostgreSQL database; a worker SIGKILLed mid-batch."""

from __future__ import annotations

import pytest

from studies.cli import main
from studies.space import build_space, parse_range
from studies.storage import StudyError

FAST = ["--epochs", "2", "--batch-size", "64", "--lr", "0.01"]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("sigma_T=-1:1", "--space gr.sigma_T: the search range [-1, 1] is not inside gr.sigma_T's "
                         "valid range (0, inf) (-1.0 is not valid)"),
        ("train.lr=0:0.1", "train.lr: the search range [0, 0.1] is not inside train.lr's valid "
                           "range (0, inf)"),
        ("train.batch_size=0,16", "train.batch_size: the search range {0, 16} is not inside "
                                  "train.batch_size's valid range [1, inf)"),
        ("train.epochs=1:5", "[1, 5] is a continuous range but train.epochs takes integers"),
        ("q2=-1,0.5", "gr.q2: the search range {-1, 0.5} is not inside gr.q2's valid range"),
    ],
)
def test_space_outside_valid_range_is_refused(spec: str, says: str) -> None:
    name, dist = parse_range(spec)
    with pytest.raises(StudyError) as err:
        build_space("gr", "yeast", overrides={name: dist})
    assert says in str(err.value)


def test_space_inside_valid_range_is_accepted() -> None:
    space = build_space("gr", "yeast", overrides=dict(
        parse_range(s) for s in ("sigma_T=0.1:1", "train.lr=1e-4:1e-2:log", "train.epochs=2,4")))
    assert {"gr.sigma_T", "train.lr", "train.epochs"} <= set(space.distributions)


def test_bad_space_creates_and_saves_nothing(yeast_store, tmp_path, capsys) -> None:
    journal, out = tmp_path / "j.log", tmp_path / "out"
    code = main(["study", yeast_store, "--loss", "gr", "--space", "sigma_T=-1:1", "--storage",
                 str(journal), "--out", str(out), *FAST])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gr.sigma_T" in err and "[-1, 1]" in err and "(0, inf)" in err
    assert not journal.exists() and not out.exists()
