"""GR Loss vs Assume-Negative on a real multi-label set, top to bottom.

Run:  pip install -e '.[yeast]' && python examples/gr_on_yeast.py

1. Build a feature store from the MULAN yeast set (2,417 rows, 103 features, 14 labels) with the
   SPML protocol: every training row keeps exactly one positive label; the rest are unknown.
2. Look at what GR Loss does to one batch: its confidence k̂ that an unknown label is positive,
   its weight v, and its three robust terms.
3. Train a linear head with AN and three GR configurations stacked as one model.
"""

import tempfile
from pathlib import Path

import torch

from featurize.imports import import_yeast
from probe import ProbeConfig, train_probe
from probe.engine.data import ProbeData
from probe.losses import gr

# 1. the store --------------------------------------------------------------------------------
with tempfile.TemporaryDirectory() as scratch:  # a scratch store, removed once it is loaded
    store = Path(scratch) / "yeast.zarr"
    import_yeast(store, progress=False)
    data = ProbeData.from_store(store)  # train / val / test features and labels, on the device
y = data.train_observed  # int8: 1 = the one observed positive, 0 = unknown
print(f"train rows {data.n_train}, classes {data.n_classes}, "
      f"observed positives per row {(y == 1).sum(1).float().mean():.2f}, "
      f"true positives per row {data.train_labels.sum(1).float().mean():.2f}")

# 2. GR's parts on one batch (paper Eqs. 4, 7, 11, 14) ----------------------------------------
x = data.train_x[:8].float()  # 8 rows; the last column is the bias input (1.0)
logits = x @ (0.1 * torch.randn(x.shape[1], data.n_classes))
parts = gr(logits, y[:8], w=10.0, b=-8.0, mu=0.8, sigma=0.5, return_parts=True)
unknown = y[:8] == 0
print(f"GR loss {parts.loss:.4f}; on unknown labels: k̂ mean {parts.k_hat[unknown].mean():.3f}, "
      f"v mean {parts.v[unknown].mean():.3f}")

# 3. train: AN, then three GR trials stacked (b_T = -2, -5, -8 at w_T = 10, i.e. the threshold
#    τ = -b/w where k̂ = 1/2 moves from p = 0.2 to 0.8) -------------------------------------
config = ProbeConfig(batch_size=32, lr=0.01, epochs=10)
for loss, trials in (("an", [{}]), ("gr", [{"b_T": -2.0}, {"b_T": -5.0}, {"b_T": -8.0}])):
    result = train_probe(data, config, loss, trials)
    for t, trial in enumerate(result.trials):
        settings = ", ".join(f"{k}={v}" for k, v in trials[t].items()) or "defaults"
        print(f"{loss:>3} ({settings:<9}) best epoch {trial.best_epoch:>2}: "
              f"val mAP {trial.best['val_map']:.2f}, test mAP {trial.best['test_map']:.2f}")
