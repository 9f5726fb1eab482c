"""SMILE's step equals the released code's on the same inputs: losses and every gradient (the
classifier's logits and each label-enhancement parameter), float64, rtol 1e-9. The released
functions below are transcribed from palm-ml/smile (``train_smile2.py``: neg_log, loss_an,
weighted_bce_loss, beta_kl_loss, vae_loss and the step; ``spl_models.py``: MLPNet, Decoder;
``gen_adj.py``: gen_adj_matrix_2), keeping their structure; dgl's ``GraphConv(norm='both')``,
which this machine lacks, is written edge by edge (scatter over the edge list, as dgl's message
passing) rather than as the dense matrices the module uses."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import euclidean_distances

from probe.losses import SMILE_YEAST, SmileNetworks, knn_graph, smile_step

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
    edge list (src, dst): messages h_src/√outdeg(src) summed at dst, times 1/√indeg(dst)."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(n_in, n_out))
        self.bias = torch.nn.Parameter(torch.empty(n_out))

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


@pytest.mark.parametrize("bias", [False, True])
def test_step_losses_and_gradients_equal_released(bias):
    torch.manual_seed(0)
    n, d, c, b = 30, 6, 4, 8
    x_train = torch.randn(n, d, dtype=torch.float64)
    obs = torch.zeros(n, c, dtype=torch.float64)
    obs[torch.arange(n), torch.randint(0, c, (n,))] = 1
    index = torch.randperm(n)[:b]
    logits = torch.randn(b, c, dtype=torch.float64, requires_grad=True)
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


def test_yeast_preset_is_the_released_run():
    assert (SMILE_YEAST["p"], SMILE_YEAST["mu"], SMILE_YEAST["rate"]) == (0.05, 0.5, 0.1)
    assert (SMILE_YEAST["epochs"], SMILE_YEAST["lr"], SMILE_YEAST["batch_size"]) == (10, 1e-3, 16)
    assert SMILE_YEAST["bias"] is False
