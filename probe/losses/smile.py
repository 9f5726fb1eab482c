"""SMILE's label enhancement — Xu, Liu, Lv, Geng et al., "One Positive Label is Sufficient:
Single-Positive Multi-Label Learning with Label Enhancement", NeurIPS 2022; released code
palm-ml/smile ``train_smile2.py`` (the step), ``spl_models.py`` (GCN, MLPNet, Decoder),
``gen_adj.py`` (``gen_adj_matrix_2``, the feature graph).

One training step on a batch (rows ``index`` of the train split, features X, observed y):

- the label-enhancement encoder, a two-layer GCN over the k = 3 nearest-neighbour graph of the
  train features (euclidean, no self-loops; symmetric normalisation D_in^{-1/2} Aᵀ D_out^{-1/2}
  as dgl's ``GraphConv(norm='both')``) followed by a linear layer, gives soft labels
  d = σ(GCN(X_train)[index] / T);
- the classifier's loss is the weighted BCE against the detached target
  D = μ·d + (1 − μ)·D₂ (D₂ = y with unobserved entries set to p), unobserved entries scaled by
  ``rate`` (the released ``--bias 0``) or by 1/(C − 1) (``--bias 1``);
- the label-enhancement networks' loss (the variational part): AN(d, y) + γ·(‖X̂ − X‖² +
  AN(ŷ, y) + ‖ŷŷᵀ − A_batch‖²) + δ·KL_Beta(d), with the hidden code h = MLP([X, d]), the
  decoders X̂ = MLP([d, h]) and ŷ ~ Beta(d + 1e-5, 1 − d + 1e-5) (reparametrised) and the
  graph decoder ŷŷᵀ; the KL term is the released ``beta_kl_loss`` with prior value 1.

The two losses touch disjoint parameters (the target D is detached), so their sum trained with
per-parameter Adam equals the released two optimizers. Logs are −log(x + 1e-5) as released.

This module holds the method's parts as functions and networks (:func:`knn_graph`,
:class:`SmileNetworks`, :func:`smile_step`); it is not yet a registered loss: the trainer does
not hand a loss the train features it needs (module notes in docs/losses.md "smile").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._base import LossInputError

__all__ = ["SMILE_YEAST", "SmileNetworks", "knn_graph", "smile_step"]

#: The released yeast run: ``train_smile2.py --ep 10 --bias 0 --ds yeast --p 0.05 --mu 0.5
#: --rate 0.1`` with the script's defaults (lr 1e-3 Adam for both networks, batch 16, T = 1,
#: γ = 0.001, δ = 1, no warm-up, k = 3 graph neighbours).
SMILE_YEAST = {"p": 0.05, "mu": 0.5, "rate": 0.1, "bias": False, "gamma": 0.001, "delta": 1.0,
               "temperature": 1.0, "epochs": 10, "lr": 1e-3, "batch_size": 16, "k": 3}

_LOG_EPS = 1e-5  # the released neg_log's epsilon


def knn_graph(x: Tensor, k: int = 3) -> Tensor:
    """The released feature graph (``gen_adj_matrix_2``): ``(N, N)`` float32 with A[i, j] = 1
    for the ``k`` rows j nearest to row i in euclidean distance, i itself excluded; ties go to
    the lower row (as the released repeated ``argmin``). Exact, in float64 (not faiss: the
    released graph is euclidean and its ties are ordered)."""
    if x.ndim != 2 or not 1 <= k < x.shape[0]:
        raise LossInputError(f"knn_graph: x must be (N, d) with N > k; got x of shape "
                             f"{tuple(x.shape)} and k={k}")
    xd = x.detach().to(torch.float64)
    dist = torch.cdist(xd, xd)
    dist.fill_diagonal_(float("inf"))
    # a stable sort keeps the lower row first among equal distances
    order = torch.sort(dist, dim=1, stable=True).indices[:, :k]
    adj = torch.zeros(x.shape[0], x.shape[0], dtype=torch.float32, device=x.device)
    adj.scatter_(1, order, 1.0)
    return adj


def _propagate(adj: Tensor, h: Tensor) -> Tensor:
    """dgl ``GraphConv(norm='both')``'s aggregation over edges i→j where adj[i, j] = 1:
    out_j = Σ_i h_i / √(outdeg_i · indeg_j), degrees clamped to at least 1."""
    out_deg = adj.sum(1).clamp(min=1)
    in_deg = adj.sum(0).clamp(min=1)
    return in_deg.rsqrt().unsqueeze(1) * (adj.T @ (out_deg.rsqrt().unsqueeze(1) * h))


class _MLP(nn.Module):
    """The released ``MLPNet``: Linear(n_in, n_out) → ReLU → Linear(n_out, n_out)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(n_in, n_out)
        self.fc2 = nn.Linear(n_out, n_out)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.relu(self.fc1(x)))


class SmileNetworks(nn.Module):
    """The label-enhancement networks of one trial for ``d`` features and ``c`` classes (the
    released sizes: hidden width C): the GCN encoder (``conv1`` d→C, ``conv2`` C→C, ``fc``),
    ``encoder_z`` MLP(d + C → C) and the feature decoder MLP(2C → d)."""

    def __init__(self, d: int, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Linear(d, c)
        self.conv2 = nn.Linear(c, c)
        self.fc = nn.Linear(c, c)
        self.encoder_z = _MLP(d + c, c)
        self.decoder_x = _MLP(2 * c, d)

    def encode(self, adj: Tensor, x_train: Tensor) -> Tensor:
        """The GCN's logits for every train row ``(N, C)``."""
        h = torch.relu(_propagate(adj, x_train @ self.conv1.weight.T) + self.conv1.bias)
        h = _propagate(adj, h @ self.conv2.weight.T) + self.conv2.bias
        return self.fc(h)


def _neg_log(x: Tensor) -> Tensor:
    return -torch.log(x + _LOG_EPS)


def _an_prob(p: Tensor, y: Tensor) -> Tensor:
    """The released ``loss_an`` on probabilities: mean of −log p (y = 1), −log(1 − p) (y = 0)."""
    return torch.where(y == 1, _neg_log(p), _neg_log(1 - p)).mean()


def _beta_kl(alpha: Tensor, beta: Tensor, prior: float, eps: float = 1e-6) -> Tensor:
    """The released ``beta_kl_loss`` (its expression, kept as released)."""
    alpha = alpha + eps
    beta = beta + eps
    kl = (torch.lgamma(alpha) + torch.lgamma(beta)) + (
        (alpha - prior) * torch.digamma(alpha) + (beta - prior) * torch.digamma(beta))
    return kl.mean()


def smile_step(nets: SmileNetworks, adj: Tensor, x_train: Tensor, index: Tensor, logits: Tensor,
               observed: Tensor, *, p: float, mu: float, rate: float, bias: bool,
               gamma: float, delta: float, temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """One released step's two losses: ``(classifier loss, label-enhancement loss)`` for the
    batch ``index`` with the classifier's ``logits`` ``(B, C)`` and ``observed`` ``(B, C)``
    (1 / 0). ``adj``: :func:`knn_graph` of ``x_train``. ŷ's Beta draw uses the global torch
    generator, as released."""
    if logits.ndim != 2 or logits.shape != observed.shape or index.shape[0] != logits.shape[0]:
        raise LossInputError(
            f"smile_step: logits (B, C), observed (B, C) and index (B,) must agree; got "
            f"{tuple(logits.shape)}, {tuple(observed.shape)}, {tuple(index.shape)}")
    y = observed.to(logits.dtype)
    x = x_train[index]
    d = torch.sigmoid(nets.encode(adj, x_train)[index] / temperature)
    hid = nets.encoder_z(torch.cat((x, d), dim=1))
    x_rec = nets.decoder_x(torch.cat((d, hid), dim=1))
    y_rec = torch.distributions.Beta(d + 1e-5, 1 - d.clone() + 1e-5).rsample()
    a_rec = y_rec @ y_rec.T

    # the classifier: weighted BCE against the detached enhanced labels
    target = (mu * d + (1 - mu) * torch.where(y == 0, torch.full_like(y, p), y)).detach()
    scores = torch.sigmoid(logits / temperature)
    entries = target * _neg_log(scores) + (1 - target) * _neg_log(1 - scores)
    scale = 1.0 / (y.shape[-1] - 1) if bias else rate
    entries = torch.where(y == 0, entries * scale, entries)
    classifier = entries.mean()

    # the label-enhancement networks (the released vae_loss)
    a_batch = adj[index][:, index]
    enhance = (_an_prob(d, y) + gamma * (F.mse_loss(x_rec, x.detach()) + _an_prob(y_rec, y)
                                         + F.mse_loss(a_rec, a_batch))
               + delta * _beta_kl(d, 1 - d, 1.0))
    return classifier, enhance
