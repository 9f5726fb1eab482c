"""SMILE's step equals the released code's on the same inputs: losses and every gradient (the
classifier's logits and each label-enhancement parameter), float64, rtol 1e-9; the networks'
initialisation equals the released modules' draws. The registered loss ``smile`` equals that
step (one step, float64) and, trained through ``probe.train_probe``, a plain loop of the
released structure built from it (two Adam optimizers, two backward passes); stacked trials
equal the trials alone; ``spml losses list/show`` and ``spml probe --loss smile`` run. The released
functions below are transcribed from palm-ml/smile (``train_smile2.py``: neg_log, loss_an,
weighted_bce_loss, beta_kl_loss, vae_loss and the step; ``spl_models.py``: MLPNet, Decoder;
``gen_adj.py``: gen_adj_matrix_2), keeping their structure; dgl's ``GraphConv(norm='both')``,
which this machine lacks, is written edge by edge (scatter over the edge list, as dgl's message
passing) rather than as the dense matrices the module uses."""

from __future__ import annotations

import importlib
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import euclidean_distances

from probe import ProbeConfig, ProbeData, train_probe
from probe.engine.config import ProbeConfigError
from probe.engine.loop import epoch_order, order_generator
from probe.losses import (
    SMILE_YEAST,
    Loss,
    LossContractError,
    LossInputError,
    SmileNetworks,
    create_loss,
    init_networks,
    knn_graph,
    knn_neighbours,
    register,
    smile,
    smile_step,
)
from probe.losses.smile import (
    BETA_SEED_OFFSET,
    NET_SEED_OFFSET,
    PARAM_NAMES,
    gcn_full,
    gcn_rows,
    graph_of,
    k_smallest,
    network_shapes,
)
from studies.cli import main

# ---- transcribed from palm-ml/smile (train_smile2.py, spl_models.py, gen_adj.py) ----


def neg_log(x):
    LOG_EPSILON = 1e-5
    return - torch.log(x + LOG_EPSILON)


def loss_an(preds, Y_obs):
    assert torch.min(Y_obs) >= 0
    loss_mtx = torch.zeros_like(Y_obs)
    loss_mtx[Y_obs == 1] = neg_log(preds[Y_obs == 1])
    loss_mtx[Y_obs == 0] = neg_log(1.0 - preds[Y_obs == 0])
    return loss_mtx.mean()


def weighted_bce_loss(preds, obs, weights, bias=True, rate=1.0):
    loss_mtx = torch.zeros_like(obs)
    loss_mtx = weights * neg_log(preds) + (1 - weights) * neg_log(1 - preds)
    if bias:
        loss_mtx[obs == 0.0] = loss_mtx[obs == 0.0] / (obs.shape[-1] - 1)
    else:
        loss_mtx[obs == 0.0] = loss_mtx[obs == 0.0] * rate
    return loss_mtx.mean()


def beta_kl_loss(alpha, beta, prior_value, eps=1e-6):
    prior = torch.ones_like(alpha) * prior_value
    alpha = alpha + eps
    beta = beta + eps
    KL = (torch.lgamma(alpha) + torch.lgamma(beta)) + \
        ((alpha - prior) * (torch.digamma(alpha)) + (beta - prior) * (torch.digamma(beta)))
    return KL.mean()


def vae_loss(args, batch_X, batch_Y_obs, batch_D_score_1, batch_G_A, batch_X_rec, batch_Y_rec,
             batch_A_rec, batch_idx):
    loss_align_1 = loss_an(batch_D_score_1, batch_Y_obs)
    loss_recx = F.mse_loss(batch_X_rec, batch_X.clone().detach())
    loss_recy = loss_an(batch_Y_rec, batch_Y_obs)
    loss_recA = F.mse_loss(batch_A_rec, batch_G_A.detach())
    loss_kl = beta_kl_loss(batch_D_score_1, 1 - batch_D_score_1, 1)
    loss = loss_align_1 + args.gamma * (loss_recx + loss_recy + loss_recA) + args.delta * loss_kl
    return loss, loss_align_1, loss - loss_align_1


class MLPNet(torch.nn.Module):
    def __init__(self, num_feats, num_classes):
        super().__init__()
        self.fc1 = torch.nn.Linear(num_feats, num_classes)
        self.fc2 = torch.nn.Linear(num_classes, num_classes)

    def forward(self, x):
        x = self.fc1(x)
        x = F.relu(x)
        x = self.fc2(x)
        return x


class Decoder(torch.nn.Module):
    def __init__(self, num_classes, hid_dim, feat_dim):
        super().__init__()
        self.linear_classifier = MLPNet(num_classes + hid_dim, feat_dim)

    def forward(self, distribution, hid_feat):
        m = torch.distributions.Beta(distribution + 1e-5, 1 - distribution.clone() + 1e-5)
        rec_y = m.rsample()
        rec_x = self.linear_classifier(torch.cat((distribution, hid_feat), dim=1))
        rec_A = torch.mm(rec_y, rec_y.T)
        return rec_x, rec_y, rec_A


def gen_adj_matrix_2(X, k=10):
    dm = euclidean_distances(X, X)
    adj_m = np.zeros_like(dm)
    row = np.arange(0, X.shape[0])
    dm[row, row] = np.inf
    for _ in range(0, k):
        col = np.argmin(dm, axis=1)
        dm[row, col] = np.inf
        adj_m[row, col] = 1.0
    return adj_m


class GraphConvBoth(torch.nn.Module):
    """dgl GraphConv(norm='both', weight=True, bias=True, allow_zero_in_degree=True) over the
    edge list (src, dst): messages h_src/√outdeg(src) summed at dst, times 1/√indeg(dst);
    initialised as dgl's reset_parameters (Xavier-uniform weight, zero bias)."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(n_in, n_out))
        self.bias = torch.nn.Parameter(torch.empty(n_out))
        torch.nn.init.xavier_uniform_(self.weight)
        torch.nn.init.zeros_(self.bias)

    def forward(self, src, dst, n, h):
        out_deg = torch.bincount(src, minlength=n).clamp(min=1).to(h.dtype)
        in_deg = torch.bincount(dst, minlength=n).clamp(min=1).to(h.dtype)
        h = h * out_deg.pow(-0.5).unsqueeze(1)
        h = h @ self.weight
        agg = torch.zeros(n, h.shape[1], dtype=h.dtype).index_add_(0, dst, h[src])
        return agg * in_deg.pow(-0.5).unsqueeze(1) + self.bias


class GCN(torch.nn.Module):
    def __init__(self, in_feats, hidden_size, num_classes):
        super().__init__()
        self.conv1 = GraphConvBoth(in_feats, hidden_size)
        self.conv2 = GraphConvBoth(hidden_size, num_classes)
        self.fc = torch.nn.Linear(num_classes, num_classes)

    def forward(self, g, inputs):
        h = self.conv1(*g, inputs)
        h = torch.relu(h)
        h = self.conv2(*g, h)
        h = self.fc(h)
        return h


def released_step(args, model_logits, encoder, encoder_z, decoder, G, G_A, train_X, batch_X,
                  batch_Y_obs, batch_idx):
    """train_smile2.py's loop body (after warm-up), the classifier's logits given."""
    batch_Y_score = torch.sigmoid(model_logits / args.T)
    batch_G_A = G_A[batch_idx, :][:, batch_idx]
    batch_D_logits_1 = encoder(G, train_X)[batch_idx]
    batch_D_score_1 = torch.sigmoid(batch_D_logits_1 / args.T)
    hid_feat = encoder_z(torch.cat((batch_X, batch_D_score_1), dim=1))
    batch_X_rec, batch_Y_rec, batch_A_rec = decoder(batch_D_score_1, hid_feat)
    batch_D_score_2 = batch_Y_obs.clone().detach()
    batch_D_score_2[batch_D_score_2 == 0] = args.p
    batch_D_score = args.mu * batch_D_score_1 + (1 - args.mu) * batch_D_score_2
    batch_D = batch_D_score.clone().detach()
    loss_predict = weighted_bce_loss(batch_Y_score, batch_Y_obs, batch_D, args.bias, args.rate)
    loss_distribution, _, _ = vae_loss(args, batch_X, batch_Y_obs, batch_D_score_1, batch_G_A,
                                       batch_X_rec, batch_Y_rec, batch_A_rec, batch_idx)
    return loss_predict, loss_distribution


def released_warmup_step(model_logits, encoder, G, train_X, batch_Y_obs, batch_idx):
    """train_smile2.py's warm-up loop body, the classifier's logits given."""
    batch_Y_score = torch.sigmoid(model_logits)
    batch_D_logits_1 = encoder(G, train_X)[batch_idx]
    batch_D_score_1 = torch.sigmoid(batch_D_logits_1)
    loss_predict = loss_an(batch_Y_score, batch_Y_obs)
    loss_distribution = loss_an(batch_D_score_1, batch_Y_obs)
    return loss_predict, loss_distribution

# ---- end of the transcription ----


def _copy_weights(nets, encoder, encoder_z, decoder):
    """The released modules take our networks' values (GraphConv's weight is (in, out))."""
    with torch.no_grad():
        encoder.conv1.weight.copy_(nets.conv1.weight.T)
        encoder.conv1.bias.copy_(nets.conv1.bias)
        encoder.conv2.weight.copy_(nets.conv2.weight.T)
        encoder.conv2.bias.copy_(nets.conv2.bias)
        encoder.fc.load_state_dict(nets.fc.state_dict())
        encoder_z.load_state_dict(nets.encoder_z.state_dict())
        decoder.linear_classifier.load_state_dict(nets.decoder_x.state_dict())


def test_knn_graph_equals_released():
    rng = np.random.default_rng(0)
    x = np.round(rng.normal(size=(40, 5)), 1)  # rounded: equal distances occur
    np.testing.assert_array_equal(knn_graph(torch.tensor(x), k=3).numpy(),
                                  gen_adj_matrix_2(x, k=3))


def test_k_smallest_equals_a_stable_sort():
    """The graph's neighbour pick equals the first k columns of a stable sort of each row
    (nearest first, ties to the lower column), on rows with many equal values and infinities
    (the excluded diagonal)."""
    gen = torch.Generator().manual_seed(0)
    for k in (1, 3, 7):
        dist = torch.randint(0, 4, (50, 30), generator=gen).to(torch.float64)
        dist[torch.rand(dist.shape, generator=gen) < 0.3] = math.inf
        want = torch.sort(dist, dim=1, stable=True).indices[:, :k]
        assert torch.equal(k_smallest(dist, k), want)


@pytest.mark.parametrize("k, batch", [(3, 8), (1, 5), (5, 40)])
def test_gcn_on_the_batch_neighbourhood_equals_the_full_graph(k, batch):
    """The encoder's GCN computed on the batch's 2-hop neighbourhood (what every step runs)
    equals the released pass over every row then kept at the batch's rows: values and the
    gradients of every GCN parameter and of the features, float64, rtol 1e-12, for 3 stacked
    trials, with repeated and unordered batch rows, and rows no edge enters (k = 1)."""
    gen = torch.Generator().manual_seed(k)
    n, d, c, t = 40, 5, 4, 3
    x = torch.randn(n, d, dtype=torch.float64, generator=gen, requires_grad=True)
    graph = graph_of(knn_neighbours(x, k))
    w = {name: torch.randn(t, *shape, dtype=torch.float64, generator=gen, requires_grad=True)
         for name, shape in network_shapes(d, c).items() if name.startswith("conv")}
    index = torch.randint(0, n, (batch,), generator=gen)
    probe = torch.randn(t, batch, c, dtype=torch.float64, generator=gen)

    full = gcn_full(w, graph, x, index)
    rows = gcn_rows(w, graph, x, index)
    torch.testing.assert_close(rows, full, rtol=1e-12, atol=1e-13)
    inputs = [x, *w.values()]
    # a non-linear read-out so each gradient depends on the values it flows through
    want = torch.autograd.grad((torch.tanh(full) * probe).sum(), inputs)
    got = torch.autograd.grad((torch.tanh(rows) * probe).sum(), inputs)
    assert float(want[0].abs().sum()) > 0  # the features' gradient is not trivially zero
    for mine, ref in zip(got, want):
        torch.testing.assert_close(mine, ref, rtol=1e-12, atol=1e-13)


def _step_inputs(seed):
    """One step's float64 inputs, drawn from ``seed``: 30 train rows of 6 features, 4 classes,
    one observed positive per row, a batch of 8 rows and its logits."""
    torch.manual_seed(seed)
    n, d, c, b = 30, 6, 4, 8
    x_train = torch.randn(n, d, dtype=torch.float64)
    obs = torch.zeros(n, c, dtype=torch.float64)
    obs[torch.arange(n), torch.randint(0, c, (n,))] = 1
    index = torch.randperm(n)[:b]
    logits = torch.randn(b, c, dtype=torch.float64, requires_grad=True)
    return n, d, c, x_train, obs, index, logits


@pytest.mark.parametrize("bias", [False, True])
def test_step_losses_and_gradients_equal_released(bias):
    n, d, c, x_train, obs, index, logits = _step_inputs(0)
    args = SimpleNamespace(p=0.05, mu=0.5, rate=0.1, bias=bias, gamma=0.3, delta=0.7, T=1.5)

    nets = SmileNetworks(d, c).double()
    encoder = GCN(d, c, c).double()
    encoder_z = MLPNet(d + c, c).double()
    decoder = Decoder(c, c, d).double()
    _copy_weights(nets, encoder, encoder_z, decoder)

    adj = knn_graph(x_train.float(), k=3).double()
    a_np = gen_adj_matrix_2(x_train.numpy(), k=3)
    rows, cols = np.nonzero(a_np)
    graph = (torch.tensor(rows), torch.tensor(cols), n)

    torch.manual_seed(123)  # the same Beta draw on both sides
    ours = smile_step(nets, adj, x_train, index, logits, obs[index], p=args.p, mu=args.mu,
                      rate=args.rate, bias=bias, gamma=args.gamma, delta=args.delta,
                      temperature=args.T)
    logits_ref = logits.detach().clone().requires_grad_(True)
    torch.manual_seed(123)
    ref = released_step(args, logits_ref, encoder, encoder_z, decoder, graph,
                        torch.tensor(a_np), x_train, x_train[index], obs[index], index)

    for got, want in zip(ours, ref):
        assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-9)
    (ours[0] + ours[1]).backward()
    (ref[0] + ref[1]).backward()
    torch.testing.assert_close(logits.grad, logits_ref.grad, rtol=1e-9, atol=1e-12)
    pairs = [(nets.conv1.weight.grad.T, encoder.conv1.weight.grad),
             (nets.conv1.bias.grad, encoder.conv1.bias.grad),
             (nets.conv2.weight.grad.T, encoder.conv2.weight.grad),
             (nets.conv2.bias.grad, encoder.conv2.bias.grad),
             (nets.fc.weight.grad, encoder.fc.weight.grad),
             (nets.encoder_z.fc1.weight.grad, encoder_z.fc1.weight.grad),
             (nets.encoder_z.fc2.bias.grad, encoder_z.fc2.bias.grad),
             (nets.decoder_x.fc1.weight.grad, decoder.linear_classifier.fc1.weight.grad),
             (nets.decoder_x.fc2.weight.grad, decoder.linear_classifier.fc2.weight.grad)]
    for got, want in pairs:
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def test_warmup_step_equals_released():
    """The warm-up step (AN on σ(z), AN on the encoder; no temperature, no draw): losses and
    gradients, float64, rtol 1e-9; the other networks get no gradient (Adam skips them)."""
    n, d, c, x_train, obs, index, logits = _step_inputs(1)
    nets = SmileNetworks(d, c).double()
    encoder, encoder_z, decoder = GCN(d, c, c).double(), MLPNet(d + c, c), Decoder(c, c, d)
    _copy_weights(nets, encoder, encoder_z, decoder)
    a_np = gen_adj_matrix_2(x_train.numpy(), k=3)
    rows, cols = np.nonzero(a_np)
    ours = smile_step(nets, knn_graph(x_train, 3).double(), x_train, index, logits, obs[index],
                      p=0.05, mu=0.5, rate=0.1, bias=False, gamma=0.3, delta=0.7,
                      temperature=2.0, warmup=True)
    logits_ref = logits.detach().clone().requires_grad_(True)
    ref = released_warmup_step(logits_ref, encoder,
                               (torch.tensor(rows), torch.tensor(cols), n), x_train,
                               obs[index], index)
    for got, want in zip(ours, ref):
        assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-9)
    (ours[0] + ours[1]).backward()
    (ref[0] + ref[1]).backward()
    torch.testing.assert_close(logits.grad, logits_ref.grad, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(nets.conv1.weight.grad.T, encoder.conv1.weight.grad, rtol=1e-9,
                               atol=1e-12)
    torch.testing.assert_close(nets.fc.weight.grad, encoder.fc.weight.grad, rtol=1e-9,
                               atol=1e-12)
    assert nets.encoder_z.fc1.weight.grad is None and nets.decoder_x.fc2.bias.grad is None


def test_yeast_preset_is_the_released_run():
    assert (SMILE_YEAST["p"], SMILE_YEAST["mu"], SMILE_YEAST["rate"]) == (0.05, 0.5, 0.1)
    assert (SMILE_YEAST["epochs"], SMILE_YEAST["lr"], SMILE_YEAST["batch_size"]) == (10, 1e-3, 16)
    assert SMILE_YEAST["bias"] is False


def test_knn_neighbours_in_blocks_equal_one_block(monkeypatch):
    """The graph is built a block of rows at a time; blocks of 7 rows give the same graph."""
    sm = importlib.import_module("probe.losses.smile")  # the module, not the function

    x = torch.tensor(np.round(np.random.default_rng(1).normal(size=(30, 4)), 1))
    whole = knn_neighbours(x, 3)
    monkeypatch.setattr(sm, "KNN_BLOCK_ENTRIES", 7 * 30)  # 7 rows a block
    assert torch.equal(sm.knn_neighbours(x, 3), whole)
    np.testing.assert_array_equal(knn_graph(x, 3).numpy(), gen_adj_matrix_2(x.numpy(), k=3))


def test_initial_networks_are_the_released_modules_draws():
    """init_networks(s) = torch.manual_seed(s); GCN(d, c, c); MLPNet(d + c, c); Decoder(c, c, d)
    of the released code (dgl GraphConv: Xavier-uniform weight, zero bias), bit for bit."""
    d, c, seed = 7, 4, 11
    torch.manual_seed(seed)
    encoder, encoder_z, decoder = GCN(d, c, c), MLPNet(d + c, c), Decoder(c, c, d)
    ours = init_networks(seed, d, c)
    want = {"conv1_w": encoder.conv1.weight, "conv1_b": encoder.conv1.bias,
            "conv2_w": encoder.conv2.weight, "conv2_b": encoder.conv2.bias,
            "fc_w": encoder.fc.weight.T, "fc_b": encoder.fc.bias,
            "enc_z1_w": encoder_z.fc1.weight.T, "enc_z1_b": encoder_z.fc1.bias,
            "enc_z2_w": encoder_z.fc2.weight.T, "enc_z2_b": encoder_z.fc2.bias,
            "dec_x1_w": decoder.linear_classifier.fc1.weight.T,
            "dec_x1_b": decoder.linear_classifier.fc1.bias,
            "dec_x2_w": decoder.linear_classifier.fc2.weight.T,
            "dec_x2_b": decoder.linear_classifier.fc2.bias}
    assert list(ours) == list(PARAM_NAMES) == list(want)
    for name, value in want.items():
        assert torch.equal(ours[name], value.detach()), name


# ---- the registered loss ----

N, D, C, BATCH = 48, 6, 4, 8
HP = {"p": 0.05, "mu": 0.5, "rate": 0.1, "bias": False, "gamma": 0.1, "delta": 1.0}


def _arrays():
    """Train / val / test (features, labels) and the train rows' flipped features."""
    rng = np.random.default_rng(0)
    out = []
    for n in (N, 16, 16):
        y = (rng.random((n, C)) < 0.3).astype(np.uint8)
        y[np.arange(n), rng.integers(0, C, n)] = 1
        out.append(((y @ rng.normal(size=(C, D)) + rng.normal(size=(n, D))).astype(np.float32),
                    y))
    flipped = (out[0][0] + 0.5 * rng.normal(size=(N, D))).astype(np.float32)
    return out, flipped


def _data() -> ProbeData:
    splits, flipped = _arrays()
    return ProbeData.from_arrays(*splits, train_flip=flipped, dtype=torch.float32)


def _layers(nets):
    return {"conv1": nets.conv1, "conv2": nets.conv2, "fc": nets.fc,
            "enc_z1": nets.encoder_z.fc1, "enc_z2": nets.encoder_z.fc2,
            "dec_x1": nets.decoder_x.fc1, "dec_x2": nets.decoder_x.fc2}


def test_one_step_of_the_registered_loss_equals_smile_step():
    """Value, parts and gradients (logits: rtol 1e-9 in float64; the float32 networks'
    parameters: rtol 1e-5) of the loss seeded with 5 against smile_step on the networks
    init_networks(5 + 2**33) draws and the global RNG seeded with 5 + 2**34."""
    (train, _, _), _ = _arrays()
    x = torch.from_numpy(train[0])
    observed = _data().train_observed
    loss = create_loss("smile", **HP)
    loss.setup(observed, n_epochs=1)
    loss.set_features(x)
    loss.manual_seed([5])
    index = torch.randperm(N, generator=torch.Generator().manual_seed(0))[:BATCH]
    z = torch.randn(BATCH, C, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    z.requires_grad_(True)
    out = loss(z, observed[index], index=index)
    out.loss.backward()

    nets = SmileNetworks.from_params(init_networks(5 + NET_SEED_OFFSET, D, C)).double()
    z_ref = z.detach().clone().requires_grad_(True)
    torch.manual_seed(5 + BETA_SEED_OFFSET)
    ref = smile_step(nets, knn_graph(x, 3).double(), x.double(), index, z_ref, observed[index],
                     **HP)
    parts = {k: float(v.detach()) for k, v in out.parts.items()}
    assert parts["classifier"] == pytest.approx(float(ref[0].detach()), rel=1e-9)
    assert parts["enhance"] == pytest.approx(float(ref[1].detach()), rel=1e-9)
    assert float(out.loss.detach()) == pytest.approx(float((ref[0] + ref[1]).detach()), rel=1e-9)
    (ref[0] + ref[1]).backward()
    torch.testing.assert_close(z.grad, z_ref.grad, rtol=1e-9, atol=1e-12)
    for stem, layer in _layers(nets).items():
        torch.testing.assert_close(getattr(loss, f"{stem}_w").grad[0],
                                   layer.weight.grad.T.float(), rtol=1e-5, atol=1e-8)
        torch.testing.assert_close(getattr(loss, f"{stem}_b").grad[0], layer.bias.grad.float(),
                                   rtol=1e-5, atol=1e-8)
    # the pure function is the sum of the step's two losses
    torch.manual_seed(5 + BETA_SEED_OFFSET)
    total = smile(z_ref, observed[index], nets, knn_graph(x, 3).double(), x.double(), index,
                  **HP)
    assert float(total.detach()) == pytest.approx(float(out.loss.detach()), rel=1e-9)


def _plain_loop(seed: int, hparams: dict, lr: float, epochs: int, warmup: int = 0):
    """The released training loop on the probe's data (probe.engine.train's docstring for the
    init and the batch order): nn.Linear seeded with ``seed``, the networks of
    init_networks(seed + 2**33), ŷ from the global RNG seeded with seed + 2**34; per batch the
    classifier's loss and step (mlp_opt), then the networks' loss and step (gcn_opt), both
    Adam. The head reads flipped rows where the epoch's coin says so, the networks never."""
    (train, _, _), flipped = _arrays()
    x = torch.from_numpy(train[0])
    both = torch.cat([x, torch.from_numpy(flipped)])
    observed = _data().train_observed
    torch.manual_seed(seed)
    head = torch.nn.Linear(D, C)
    nets = SmileNetworks.from_params(init_networks(seed + NET_SEED_OFFSET, D, C))
    adj = knn_graph(x, k=3)
    mlp_opt = torch.optim.Adam(head.parameters(), lr=lr)
    gcn_opt = torch.optim.Adam(nets.parameters(), lr=lr)
    torch.manual_seed(seed + BETA_SEED_OFFSET)
    gen = order_generator(seed)
    epoch_losses = []
    for epoch in range(epochs):
        perm, rows = epoch_order(gen, N, flip=True)
        losses = []
        for step in range(N // BATCH):
            sl = slice(step * BATCH, (step + 1) * BATCH)
            idx = perm[sl]
            classifier, enhance = smile_step(nets, adj, x, idx, head(both[rows[sl]]),
                                             observed[idx], **hparams, warmup=epoch < warmup)
            mlp_opt.zero_grad()
            classifier.backward()
            mlp_opt.step()
            gcn_opt.zero_grad()
            enhance.backward()
            gcn_opt.step()
            losses.append(float(classifier.detach()) + float(enhance.detach()))
        epoch_losses.append(float(np.mean(losses)))
    return head, epoch_losses


def _config(**kw) -> ProbeConfig:
    return ProbeConfig(**{"epochs": 2, "batch_size": BATCH, "lr": 1e-2, "seed": 3,
                          "eval_every": 0, "device": "cpu", **kw})


@pytest.mark.parametrize("warmup", [0, 1])
def test_trained_through_the_probe_equals_the_released_loop(warmup):
    """Two epochs of 6 steps, flips on, without and with a warm-up epoch: the final head (atol
    2e-5, rtol 1e-4, float32 after 12 Adam steps) and each epoch's mean loss (rel 1e-5); the
    loss was handed the unflipped train features without the bias column."""
    loss = create_loss("smile", **HP, warmup=warmup)
    result = train_probe(_data(), _config(), loss)
    head, losses = _plain_loop(3, HP, lr=1e-2, epochs=2, warmup=warmup)
    ours = result.head(0, best=False)
    torch.testing.assert_close(ours.weight, head.weight.detach(), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(ours.bias, head.bias.detach(), atol=2e-5, rtol=1e-4)
    assert [e["train_loss"] for e in result.trials[0].epochs] == pytest.approx(losses, rel=1e-5)
    (train, _, _), _ = _arrays()
    assert torch.equal(loss.x_train, torch.from_numpy(train[0]))
    assert result.config["flip_used"]


@pytest.mark.parametrize("how", ["seeds", "hparams"])
def test_stacked_trials_equal_the_trials_alone(how):
    """Two seeds (a loss object per trial), or two hyperparameter sets with one seed (one loss
    object, (2,) hyperparameters, stacked networks): final heads and losses as alone."""
    data = _data()
    if how == "seeds":
        stacked = train_probe(data, _config(seeds=(3, 4)), "smile", HP)
        alone = [train_probe(data, _config(seed=s), "smile", HP) for s in (3, 4)]
    else:
        trials = [{**HP, "gamma": 0.1, "p": 0.05}, {**HP, "gamma": 0.01, "p": 0.2}]
        stacked = train_probe(data, _config(), "smile", trials)
        alone = [train_probe(data, _config(), "smile", t) for t in trials]
    assert stacked.shared_batch_order == (how == "hparams")
    for t, single in enumerate(alone):
        torch.testing.assert_close(stacked.final_heads[t], single.final_heads[0], rtol=1e-5,
                                   atol=1e-6)
        assert [e["train_loss"] for e in stacked.trials[t].epochs] == pytest.approx(
            [e["train_loss"] for e in single.trials[0].epochs], rel=1e-5)
    assert not torch.equal(stacked.final_heads[0], stacked.final_heads[1])


def test_a_pruned_trial_leaves_and_the_other_continues_as_alone():
    """Three epochs of two stacked trials; trial 0 stopped after epoch 1 (select_trials drops
    its networks and optimizer rows): trial 1 ends with the head it gets alone."""
    data = _data()
    trials = [{**HP, "gamma": 0.1}, {**HP, "gamma": 0.01, "p": 0.2}]
    cfg = _config(epochs=3, eval_every=1)
    stacked = train_probe(data, cfg, "smile", trials,
                          callback=lambda report: [0] if report.epoch == 1 else [])
    alone = train_probe(data, cfg, "smile", trials[1])
    assert stacked.trials[0].stopped_at == 1 and len(stacked.trials[0].epochs) == 1
    torch.testing.assert_close(stacked.final_heads[1], alone.final_heads[0], rtol=1e-5,
                               atol=1e-6)


def test_clear_errors():
    observed = _data().train_observed
    loss = create_loss("smile")
    loss.setup(observed, n_epochs=1)
    with pytest.raises(LossInputError, match="call set_features"):
        loss(torch.zeros(2, C), observed[:2], index=torch.arange(2))
    with pytest.raises(LossInputError, match=r"features, a float tensor \(48, D\)"):
        loss.set_features(torch.zeros(N + 1, D))
    stacked = create_loss("smile", lr_mult=torch.tensor([1.0, 2.0]))
    with pytest.raises(LossInputError, match="lr_mult must be one value"):
        stacked.setup(observed, n_epochs=1, n_trials=2)
    with pytest.raises(LossInputError, match="neighbours=48 needs more than 48 train rows"):
        big_k = create_loss("smile", neighbours=N)
        big_k.setup(observed, n_epochs=1)
        big_k.set_features(torch.zeros(N, D))
    from probe.engine.trials import setup_loss_groups

    plan = SimpleNamespace(losses=[create_loss("smile")], n=1, shared=True, draw_index=None,
                           training=SimpleNamespace(epochs=1), prior=None, seeds=[0],
                           cls=type(loss))
    with pytest.raises(ProbeConfigError, match="reads the train features"):
        setup_loss_groups(plan, observed, torch.device("cpu"))


def test_a_loss_that_needs_features_must_take_them():
    with pytest.raises(LossContractError, match="defines no set_features"):
        register(type("NoFeatures", (Loss,), {
            "name": "no_features", "paper": "p", "formula": "f", "needs_features": True,
            "trial_state": (), "forward": lambda self, z, y, index=None: z}))


def test_cli_lists_shows_and_probes_smile(tmp_path, capsys):
    """``spml losses list`` names smile, ``show`` its paper, parts and yeast preset, and ``spml
    probe --loss smile`` trains on a small store named yeast (the preset applies)."""
    assert main(["losses", "list"]) == 0
    assert "smile" in capsys.readouterr().out
    assert main(["losses", "show", "smile"]) == 0
    card = capsys.readouterr().out
    assert "NeurIPS 2022" in card and "GCN" in card and "Beta" in card
    assert "yeast: " in card and "p=0.05" in card and "Nothing is reconstructed" in card
    rng = np.random.default_rng(2)
    y = (rng.random((120, 14)) < 0.3).astype(np.uint8)
    y[np.arange(120), rng.integers(0, 14, 120)] = 1
    x = (y @ rng.normal(size=(14, 8)) + rng.normal(size=(120, 8))).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    store = tmp_path / "y.zarr"
    assert main(["import", "arrays", "--features", str(tmp_path / "x.npy"), "--labels",
                 str(tmp_path / "y.npy"), "--name", "yeast", "--split", "0.8,0.1,0.1",
                 "--out", str(store), "--quiet"]) == 0
    out = tmp_path / "run.json"
    assert main(["probe", str(store), "--loss", "smile", "--epochs", "2", "--device", "cpu",
                 "--intervals", "0", "--json", str(out), "--quiet"]) == 0
    payload = json.loads(out.read_text())
    trial = payload["trials"][0]
    assert trial["hparams"]["p"] == 0.05 and trial["hparams"]["bias"] is False
    assert payload["config"]["batch_size"] == 16 and payload["config"]["lr"] == 1e-3
    assert 0 < trial["best"]["test_map"] <= 100


def test_the_fine_tune_refuses_smile_by_name():
    """The fine-tune trains the backbone, so the features SMILE builds its graph from once
    would change every step: refused before anything loads, with the command that works."""
    from studies.finetune.run import FinetuneConfig, FinetuneError, build_loss

    with pytest.raises(FinetuneError, match=r"--loss smile reads the train split's features.*"
                                            r"spml probe STORE --loss smile"):
        build_loss(FinetuneConfig("yeast", "unused", "smile", "unused"), {}, None)


@pytest.mark.parametrize(("loss", "says"), [("smile", "reads the train split's features"),
                                            ("vlpl", "reads a store prior")])
def test_spml_finetune_refuses_a_probe_only_loss_before_reading_anything(tmp_path, capsys, loss,
                                                                         says):
    from studies.cli import main

    root = tmp_path / "no-such-folder"  # refused before the images are looked for
    assert main(["finetune", "folder", "--root", str(root), "--loss", loss,
                 "--out", str(tmp_path / "ft")]) == 2
    err = capsys.readouterr().err
    assert says in err and f"spml probe STORE --loss {loss}" in err
    assert not (tmp_path / "ft").exists()
