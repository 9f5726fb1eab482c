"""Every registered loss, one contract: finite values and gradients (|z| up to 100, float16,
float64, rows/classes without positives), the trial axis (T stacked = T separate runs, values
and gradients, through setup / epoch hooks / per-example state), pruning (select_trials keeps
the survivors exact), and clear errors. The checks live in :mod:`probe.losses.testing`, where a
plugin's own tests find them too."""

from __future__ import annotations

import pytest
import torch

import probe.losses as L
from probe.losses import LossInputError, available, create_loss, get_loss_class
from probe.losses import testing as contract

B, C = contract.B, contract.C
NAMES = available()


@pytest.mark.parametrize("name", NAMES)
def test_registered_loss_is_documented(name):
    contract.check_documented(name)
    assert hasattr(L, name), f"pure function probe.losses.{name} is missing"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_finite_values_and_gradients(name, dtype, scale):
    contract.check_finite(name, dtype, scale)


@pytest.mark.parametrize("name", NAMES)
def test_trial_axis_equals_separate_runs(name):
    """T stacked trials (per-trial hyperparameters as (T,) tensors) equal T separate runs."""
    contract.check_trial_axis(name)


@pytest.mark.parametrize("name", NAMES)
def test_selected_trials_continue_as_before(name):
    """A pruned trial leaves the stack (select_trials) and the others compute as before; a loss
    that opts out (trial_state None) refuses select_trials."""
    contract.check_select_trials(name)


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_round_trip(name):
    """Per-example state lives in buffers/parameters, so it is saved with the rest."""
    contract.check_state_dict(name)


# stateful losses' pure functions take their state as an argument (ROLE's Θ, APL's soft
# targets, LL-Cp's flips); their own test files check those functions' bad-input errors
STATELESS = [n for n in NAMES if not get_loss_class(n).stateful]


@pytest.mark.parametrize("name", STATELESS)
def test_pure_function_rejects_bad_observed(name):
    fn = getattr(L, name)
    z = torch.zeros(B, C)
    bad = torch.full((B, C), 2, dtype=torch.int8)
    kwargs = {"k": 2.0} if any(s.name == "k" for s in get_loss_class(name).hparam_specs) else {}
    with pytest.raises(LossInputError, match="observed"):
        fn(z, bad, **kwargs)
    with pytest.raises(LossInputError, match="observed"):
        fn(z, torch.zeros(B, C + 1, dtype=torch.int8), **kwargs)
    with pytest.raises(LossInputError, match="logits"):
        fn(torch.zeros(C), torch.zeros(C, dtype=torch.int8), **kwargs)


def test_unknown_loss_name_suggests_closest():
    with pytest.raises(LossInputError, match="unknown loss 'a_n'; did you mean 'an'"):
        create_loss("a_n")
    with pytest.raises(LossInputError, match="unknown loss 'nope'"):
        create_loss("nope")


def test_unknown_and_out_of_range_hparams_are_named():
    with pytest.raises(LossInputError, match=r"unknown hyperparameter 'epps'.*did you mean 'eps'"):
        create_loss("an_ls", epps=0.1)
    with pytest.raises(LossInputError, match=r"'eps' must lie in \[0, 0.5\).*got 0.7"):
        create_loss("an_ls", eps=0.7)
    with pytest.raises(LossInputError, match=r"'eps' must have shape \(2,\)"):
        create_loss("an_ls", eps=torch.tensor([0.1, 0.2])).set_hparam("eps", torch.tensor([0.1]))


@pytest.mark.parametrize("name", NAMES)
def test_training_step_does_not_synchronise(name):
    """docs/design.md: no host synchronisation inside an epoch — the forward and backward of every
    registered loss, stacked, mid-run (schedules and state active), make no device→host read."""
    contract.check_no_host_sync(name)
