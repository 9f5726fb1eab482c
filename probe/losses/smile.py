"""SMILE's label enhancement — Xu, Liu, Lv, Geng et al., "One Positive Label is Sufficient:
Single-Positive Multi-Label Learning with Label Enhancement", NeurIPS 2022; released code
palm-ml/smile ``train_smile2.py`` (the step), ``spl_models.py`` (GCN, MLPNet, Decoder),
``gen_adj.py`` (``gen_adj_matrix_2``, the feature graph). Spec: docs/losses.md "smile".

One training step on a batch (rows ``index`` of the train split, features X, observed y):

- the label-enhancement encoder, a two-layer GCN over the k = 3 nearest-neighbour graph of the
  train features (euclidean, no self-loops; symmetric normalisation D_in^{-1/2} Aᵀ D_out^{-1/2}
  as dgl's ``GraphConv(norm='both')``) followed by a linear layer, gives soft labels
  d = σ(GCN(X_train)[index] / T), computed on the batch's 2-hop neighbourhood of the graph
  (:func:`gcn_rows`: the same sums as the released full-graph pass, equal to float rounding);
- the classifier's loss is the weighted BCE against the detached target
  D = μ·d + (1 − μ)·D₂ (D₂ = y with unobserved entries set to p), unobserved entries scaled by
  ``rate`` (the released ``--bias 0``) or by 1/(C − 1) (``--bias 1``);
- the label-enhancement networks' loss (the variational part): AN(d, y) + γ·(‖X̂ − X‖² +
  AN(ŷ, y) + ‖ŷŷᵀ − A_batch‖²) + δ·KL_Beta(d), with the hidden code h = MLP([X, d]), the
  decoders X̂ = MLP([d, h]) and ŷ ~ Beta(d + 1e-5, 1 − d + 1e-5) (reparametrised) and the
  graph decoder ŷŷᵀ; the KL term is the released ``beta_kl_loss`` with prior value 1.

The two losses touch disjoint parameters (the target D is detached, the classifier's loss does
not reach the networks and theirs does not reach the classifier), so one backward pass of their
sum, with per-parameter Adam on the head and on the networks, equals the released two
optimizers, each stepping on its own loss. Logs are −log(x + 1e-5) as released.

The parts: :func:`knn_neighbours` / :func:`knn_graph` (the graph), :func:`init_networks` (the
released initialisation of one trial's networks), :class:`SmileNetworks` (one trial's networks
as modules) and :func:`smile_step` (one step's two losses; tested equal to the released code),
and the registered loss :class:`SMILE` (``smile``), which holds T trials' networks as stacked
``(T, in, out)`` parameters and computes every trial with the same core (:func:`_smile_parts`).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from ._base import HParam, Loss, LossInputError, register
from ._hparams import LossOutput, hp, mean_bc, per_trial, promote

__all__ = ["SMILE_YEAST", "SmileNetworks", "gcn_full", "gcn_rows", "graph_of", "init_networks",
           "k_smallest", "knn_graph", "knn_neighbours", "network_shapes", "smile", "smile_step"]

PAPER = ("Xu, Liu, Lv, Geng et al., One Positive Label is Sufficient: Single-Positive "
         "Multi-Label Learning with Label Enhancement, NeurIPS 2022")

#: The released yeast run: ``train_smile2.py --ep 10 --bias 0 --ds yeast --p 0.05 --mu 0.5
#: --rate 0.1`` with the script's defaults (lr 1e-3 Adam for both networks, batch 16, T = 1,
#: γ = 0.001, δ = 1, no warm-up, k = 3 graph neighbours).
SMILE_YEAST = {"p": 0.05, "mu": 0.5, "rate": 0.1, "bias": False, "gamma": 0.001, "delta": 1.0,
               "temperature": 1.0, "epochs": 10, "lr": 1e-3, "batch_size": 16, "neighbours": 3}

_LOG_EPS = 1e-5  # the released neg_log's epsilon
_BETA_EPS = 1e-5  # the released Decoder's Beta(d + 1e-5, 1 - d + 1e-5)
#: trial seed s: the networks are drawn from a CPU generator seeded with s + NET_SEED_OFFSET,
#: ŷ's Beta draws from a generator (on the loss's device) seeded with s + BETA_SEED_OFFSET; both
#: clear of the head's init stream (s) and the batch-order stream (s + 2**32)
NET_SEED_OFFSET = 2**33
BETA_SEED_OFFSET = 2**34
#: distances computed at once while building the graph (float64: 128 MB)
KNN_BLOCK_ENTRIES = 1 << 24


# ---------------------------------------------------------------------------------------------
# the feature graph
# ---------------------------------------------------------------------------------------------


def knn_neighbours(x: Tensor, k: int = 3) -> Tensor:
    """The released feature graph (``gen_adj_matrix_2``) as each row's ``k`` neighbours,
    ``(N, k)`` int64: the rows nearest to row i in euclidean distance, i itself excluded; ties
    go to the lower row (as the released repeated ``argmin``). In float64, a block of rows at a
    time (:data:`KNN_BLOCK_ENTRIES` distances)."""
    if x.ndim != 2 or isinstance(k, bool) or not 1 <= k < x.shape[0]:
        raise LossInputError(f"knn_graph: x must be (N, d) with N > k >= 1; got x of shape "
                             f"{tuple(x.shape)} and k={k}")
    xd = x.detach().to(torch.float64)
    n = xd.shape[0]
    block = max(1, KNN_BLOCK_ENTRIES // n)
    out = torch.empty(n, k, dtype=torch.int64, device=x.device)
    for start in range(0, n, block):
        stop = min(n, start + block)
        dist = torch.cdist(xd[start:stop], xd)
        rows = torch.arange(stop - start, device=x.device)
        dist[rows, rows + start] = math.inf
        out[start:stop] = k_smallest(dist, k)
    return out


def k_smallest(dist: Tensor, k: int) -> Tensor:
    """Each row's ``k`` smallest entries' columns, nearest first, ties to the lower column:
    the first k of a stable sort of the row, without sorting the row. Every entry below the
    k-th smallest value is taken, then the lowest columns among those equal to it."""
    kth = torch.topk(dist, k, dim=1, largest=False).values[:, -1:]
    ties = dist == kth
    room = k - (dist < kth).sum(1, keepdim=True)  # places left for the tied entries
    take = (dist < kth) | (ties & (torch.cumsum(ties, 1) <= room))
    cols = take.nonzero()[:, 1].view(-1, k)  # ascending columns in each row
    # nearest first; the stable sort keeps the lower column first among equal distances
    order = torch.sort(torch.gather(dist, 1, cols), dim=1, stable=True).indices
    return torch.gather(cols, 1, order)


def knn_graph(x: Tensor, k: int = 3) -> Tensor:
    """The released feature graph (``gen_adj_matrix_2``): ``(N, N)`` float32 with A[i, j] = 1
    for the ``k`` rows j nearest to row i (:func:`knn_neighbours`). Exact, in float64 (not
    faiss: the released graph is euclidean and its ties are ordered)."""
    nbrs = knn_neighbours(x, k)
    adj = torch.zeros(x.shape[0], x.shape[0], dtype=torch.float32, device=x.device)
    adj.scatter_(1, nbrs, 1.0)
    return adj


class _Graph(NamedTuple):
    """A k-nearest-neighbour graph ready for the GCN: ``neighbours`` ``(N, k)`` (A[i, j] = 1 for
    j in row i), ``index`` ``(2, E)`` and ``weight`` ``(E,)`` of the sparse propagation matrix
    Â = D_in^{-1/2} Aᵀ D_out^{-1/2} (dgl ``GraphConv(norm='both')``: out_j = Σ_{i→j} h_i /
    √(outdeg_i · indeg_j), degrees clamped to at least 1), its entries in coalesced order."""

    neighbours: Tensor
    index: Tensor
    weight: Tensor


def graph_of(neighbours: Tensor) -> _Graph:
    """The feature graph of each row's ``neighbours`` ``(N, k)``: its edges with dgl's
    ``GraphConv(norm='both')`` weights (D_in^{-1/2} Aᵀ D_out^{-1/2})."""
    n, k = neighbours.shape
    src = torch.arange(n, device=neighbours.device).repeat_interleave(k)
    dst = neighbours.reshape(-1)
    # float64: a float64 computation gets exact weights, a float32 one rounds them once
    in_deg = torch.bincount(dst, minlength=n).clamp(min=1).to(torch.float64)
    weight = in_deg[dst].rsqrt() / math.sqrt(k)  # every out-degree is k
    order = torch.argsort(dst * n + src)  # Â[dst, src], rows then columns: coalesced
    return _Graph(neighbours, torch.stack([dst[order], src[order]]), weight[order])


def _graph_from_adjacency(adj: Tensor) -> _Graph:
    """:func:`knn_graph`'s dense matrix as a :class:`_Graph` (k ones in every row)."""
    counts = adj.sum(1)
    k = int(counts[0]) if adj.ndim == 2 and adj.shape[0] else 0
    if adj.ndim != 2 or adj.shape[0] != adj.shape[1] or k < 1 or not bool((counts == k).all()):
        raise LossInputError(
            f"smile_step: adj must be knn_graph(x_train, k): (N, N) with k >= 1 ones in every "
            f"row; got shape {tuple(adj.shape)}")
    return graph_of(adj.nonzero()[:, 1].view(adj.shape[0], k))


def _propagate(graph: _Graph, h: Tensor) -> Tensor:
    """Â @ h for every trial: ``h`` ``(T, N, F)`` → ``(T, N, F)`` (one sparse product)."""
    t, n, f = h.shape
    a = torch.sparse_coo_tensor(graph.index, graph.weight.to(h.dtype), (n, n),
                                is_coalesced=True, check_invariants=False)
    out = torch.sparse.mm(a, h.transpose(0, 1).reshape(n, t * f))
    return out.view(n, t, f).transpose(0, 1)


def _batch_block(graph: _Graph, index: Tensor, dtype: torch.dtype) -> Tensor:
    """A[index][:, index] ``(B, B)``: 1 where the column's row is among the row's neighbours."""
    rows = graph.neighbours[index]  # (B, k)
    return (rows.unsqueeze(-1) == index.view(1, 1, -1)).any(-2).to(dtype)


# ---------------------------------------------------------------------------------------------
# the label-enhancement networks
# ---------------------------------------------------------------------------------------------


def network_shapes(d: int, c: int) -> dict[str, tuple[int, ...]]:
    """One trial's parameters, weights as (in, out), in the released construction order:
    GCN (conv1, conv2: dgl GraphConv; fc), encoder_z (MLPNet), decoder (MLPNet)."""
    return {"conv1_w": (d, c), "conv1_b": (c,), "conv2_w": (c, c), "conv2_b": (c,),
            "fc_w": (c, c), "fc_b": (c,),
            "enc_z1_w": (d + c, c), "enc_z1_b": (c,), "enc_z2_w": (c, c), "enc_z2_b": (c,),
            "dec_x1_w": (2 * c, d), "dec_x1_b": (d,), "dec_x2_w": (d, d), "dec_x2_b": (d,)}


#: the stacked parameters of :class:`SMILE` (``(T, …)``), also its ``trial_state``
PARAM_NAMES = tuple(network_shapes(1, 1))


def init_networks(seed: int, d: int, c: int) -> dict[str, Tensor]:
    """One trial's initial networks for ``d`` features and ``c`` classes (hidden width c, as
    released), weights as ``(in, out)``: the draws of ``torch.manual_seed(seed); GCN(d, c, c);
    MLPNet(d + c, c); MLPNet(2c, d)`` in the released code, from a private CPU generator --
    dgl's ``GraphConv`` draws a Xavier-uniform ``(in, out)`` weight and a zero bias,
    ``nn.Linear`` a Kaiming-uniform (a = √5) ``(out, in)`` weight and a uniform bias in
    ±1/√in."""
    g = torch.Generator().manual_seed(int(seed))
    out: dict[str, Tensor] = {}
    for name, shape in network_shapes(d, c).items():
        if not name.endswith("_w"):
            continue
        stem, (n_in, n_out) = name[:-2], shape
        if stem.startswith("conv"):
            w = torch.empty(n_in, n_out)
            nn.init.xavier_uniform_(w, generator=g)
            out[name], out[f"{stem}_b"] = w, torch.zeros(n_out)
        else:
            w = torch.empty(n_out, n_in)
            nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=g)
            bound = 1 / math.sqrt(n_in)
            b = torch.empty(n_out)
            nn.init.uniform_(b, -bound, bound, generator=g)
            out[name], out[f"{stem}_b"] = w.T.contiguous(), b
    return {name: out[name] for name in PARAM_NAMES}


class _MLP(nn.Module):
    """The released ``MLPNet``: Linear(n_in, n_out) → ReLU → Linear(n_out, n_out)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(n_in, n_out)
        self.fc2 = nn.Linear(n_out, n_out)


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

    def layers(self) -> dict[str, nn.Linear]:
        return {"conv1": self.conv1, "conv2": self.conv2, "fc": self.fc,
                "enc_z1": self.encoder_z.fc1, "enc_z2": self.encoder_z.fc2,
                "dec_x1": self.decoder_x.fc1, "dec_x2": self.decoder_x.fc2}

    @classmethod
    def from_params(cls, params: dict[str, Tensor]) -> SmileNetworks:
        """Networks holding ``params`` (one trial's, as :func:`init_networks` returns them)."""
        d, c = params["conv1_w"].shape
        nets = cls(d, c)
        with torch.no_grad():
            for stem, layer in nets.layers().items():
                layer.weight.copy_(params[f"{stem}_w"].T)
                layer.bias.copy_(params[f"{stem}_b"])
        return nets

    def stacked(self) -> dict[str, Tensor]:
        """The parameters as one trial of :class:`SMILE`'s stack: ``(1, in, out)`` weights and
        ``(1, out)`` biases, views that keep the gradient flowing to this module."""
        out: dict[str, Tensor] = {}
        for stem, layer in self.layers().items():
            out[f"{stem}_w"] = layer.weight.T.unsqueeze(0)
            out[f"{stem}_b"] = layer.bias.unsqueeze(0)
        return out


# ---------------------------------------------------------------------------------------------
# the step
# ---------------------------------------------------------------------------------------------


def _neg_log(x: Tensor) -> Tensor:
    return -torch.log(x + _LOG_EPS)


def _an_prob(p: Tensor, y: Tensor) -> Tensor:
    """The released ``loss_an`` on probabilities: mean over (B, C) of −log p (y = 1),
    −log(1 − p) (otherwise)."""
    return mean_bc(torch.where(y == 1, _neg_log(p), _neg_log(1 - p)))


def _mse(a: Tensor, b: Tensor) -> Tensor:
    """``F.mse_loss`` per trial: the mean over the last two axes."""
    return mean_bc((a - b) ** 2)


def _beta_kl(alpha: Tensor, beta: Tensor, prior: float, eps: float = 1e-6) -> Tensor:
    """The released ``beta_kl_loss`` (its expression, kept as released), per trial."""
    alpha = alpha + eps
    beta = beta + eps
    kl = (torch.lgamma(alpha) + torch.lgamma(beta)) + (
        (alpha - prior) * torch.digamma(alpha) + (beta - prior) * torch.digamma(beta))
    return mean_bc(kl)


def _mlp(x: Tensor, w: dict[str, Tensor], stem: str) -> Tensor:
    """The released ``MLPNet`` on stacked weights: ``x`` ``(T, B, in)`` → ``(T, B, out)``."""
    h = torch.relu(torch.matmul(x, w[f"{stem}1_w"]) + w[f"{stem}1_b"].unsqueeze(1))
    return torch.matmul(h, w[f"{stem}2_w"]) + w[f"{stem}2_b"].unsqueeze(1)


def _in_edges(graph: _Graph, rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The edges of Â into ``rows`` (sorted, distinct node numbers): ``(dst, src, weight)``
    with ``dst`` the position in ``rows`` and ``src`` the source node, in Â's coalesced
    order (the entries of row rows[0] first, each row's sources ascending)."""
    dst_all = graph.index[0]
    first = torch.searchsorted(dst_all, rows)
    counts = torch.searchsorted(dst_all, rows, right=True) - first
    dst = torch.repeat_interleave(torch.arange(rows.shape[0], device=rows.device), counts)
    # edge e of row r sits at first[r] + (its rank among row r's edges)
    row_start = torch.cumsum(counts, 0) - counts
    edge = first[dst] + torch.arange(dst.shape[0], device=rows.device) - row_start[dst]
    return dst, graph.index[1, edge], graph.weight[edge]


def _sum_in(dst: Tensor, weight: Tensor, h_src: Tensor, n_rows: int) -> Tensor:
    """Σ over the edges into each of ``n_rows`` rows of weight · h_src: ``h_src`` ``(T, E, F)``
    (one row per edge) → ``(T, n_rows, F)``."""
    terms = h_src * weight.to(h_src.dtype).view(1, -1, 1)
    out = terms.new_zeros(h_src.shape[0], n_rows, h_src.shape[2])
    return out.index_add(1, dst, terms)


def gcn_full(w: dict[str, Tensor], graph: _Graph, x_all: Tensor, index: Tensor) -> Tensor:
    """The released GCN (two GraphConv layers) over every train row, kept at the batch's rows
    ``index``: ``(T, B, C)``. The reference for :func:`gcn_rows`."""
    hid = _propagate(graph, torch.matmul(x_all, w["conv1_w"])) + w["conv1_b"].unsqueeze(1)
    hid = _propagate(graph, torch.matmul(torch.relu(hid), w["conv2_w"]))
    return (hid + w["conv2_b"].unsqueeze(1))[:, index]


def gcn_rows(w: dict[str, Tensor], graph: _Graph, x_all: Tensor, index: Tensor) -> Tensor:
    """:func:`gcn_full` computed on the batch's 2-hop in-neighbourhood only: a two-layer
    GCN's value at node j reads the first layer at j's in-neighbours, which reads the features
    at theirs, with the full graph's per-edge weights. The same sum over the same terms as the
    full-graph form; the order of the additions may differ, so the two agree to float rounding,
    not bit for bit (tests/test_losses_smile.py checks values and gradients in float64)."""
    rows2, back = torch.unique(index, return_inverse=True)  # the batch's nodes, sorted
    dst2, src2, weight2 = _in_edges(graph, rows2)
    rows1, src2_at = torch.unique(src2, return_inverse=True)  # the first layer's nodes
    dst1, src1, weight1 = _in_edges(graph, rows1)
    rows0, src1_at = torch.unique(src1, return_inverse=True)  # the features' nodes
    proj = torch.matmul(x_all[rows0], w["conv1_w"])  # X W₁ at the rows read
    hid = _sum_in(dst1, weight1, proj[:, src1_at], rows1.shape[0]) + w["conv1_b"].unsqueeze(1)
    proj = torch.matmul(torch.relu(hid), w["conv2_w"])
    hid = _sum_in(dst2, weight2, proj[:, src2_at], rows2.shape[0]) + w["conv2_b"].unsqueeze(1)
    return hid[:, back]


def _encode(w: dict[str, Tensor], graph: _Graph, x_all: Tensor, index: Tensor,
            temperature: Any) -> Tensor:
    """The encoder's soft labels d = σ(GCN(X)[index] / T) ``(T, B, C)``: the two GraphConv
    layers at the batch's rows (:func:`gcn_rows`), then the linear layer."""
    hid = gcn_rows(w, graph, x_all, index)
    return torch.sigmoid((torch.matmul(hid, w["fc_w"]) + w["fc_b"].unsqueeze(1)) / temperature)


def _smile_parts(params: dict[str, Tensor], graph: _Graph, x_train: Tensor, index: Tensor,
                 z: Tensor, observed: Tensor, h: dict[str, Any], bias: bool,
                 draw_beta: Any, warmup: bool = False) -> tuple[Tensor, Tensor]:
    """The step's ``(classifier loss, label-enhancement loss)``, each ``(T,)``, for the
    classifier's logits ``z`` ``(T, B, C)`` of the train rows ``index`` ``(B,)``; ``params``:
    the stacked networks (``(T, in, out)`` weights, ``(T, out)`` biases); ``h``: p, mu, rate,
    gamma, delta, temperature as numbers or ``(T, 1, 1)`` views; ``draw_beta(a, b)``: the
    reparametrised Beta draw ``(T, B, C)``; ``warmup``: the released warm-up step instead (AN
    on σ(z) and on the encoder's σ(GCN), no temperature, no draw). Everything is computed in
    ``z``'s dtype."""
    dt = z.dtype
    w = {name: value.to(dt) for name, value in params.items()}
    x_all = x_train.to(dt)
    if warmup:
        d = _encode(w, graph, x_all, index, 1.0)
        return _an_prob(torch.sigmoid(z), observed), _an_prob(d, observed)
    t = z.shape[0]
    temp = h["temperature"]
    d = _encode(w, graph, x_all, index, temp)
    x = x_all[index].expand(t, -1, -1)
    code = _mlp(torch.cat((x, d), dim=-1), w, "enc_z")
    x_rec = _mlp(torch.cat((d, code), dim=-1), w, "dec_x")
    y_rec = draw_beta(d + _BETA_EPS, 1 - d + _BETA_EPS)
    a_rec = torch.matmul(y_rec, y_rec.transpose(-1, -2))

    # the classifier: weighted BCE against the detached enhanced labels; an observed negative
    # (y = −1) counts as observed, with D₂ = 0
    known = (observed == 1).to(dt)
    d2 = torch.where(observed == 0, torch.as_tensor(h["p"], dtype=dt, device=z.device), known)
    target = (h["mu"] * d + (1 - h["mu"]) * d2).detach()
    scores = torch.sigmoid(z / temp)
    entries = target * _neg_log(scores) + (1 - target) * _neg_log(1 - scores)
    scale = 1.0 / (z.shape[-1] - 1) if bias else h["rate"]
    classifier = mean_bc(torch.where(observed == 0, entries * scale, entries))

    # the label-enhancement networks (the released vae_loss)
    a_batch = _batch_block(graph, index, dt)
    rec = _mse(x_rec, x) + _an_prob(y_rec, observed) + _mse(a_rec, a_batch)
    enhance = (_an_prob(d, observed) + per_trial(h["gamma"]) * rec
               + per_trial(h["delta"]) * _beta_kl(d, 1 - d, 1.0))
    return classifier, enhance


def _global_beta(a: Tensor, b: Tensor) -> Tensor:
    """The released draw: ``torch.distributions.Beta(a, b).rsample()`` on the global RNG."""
    return torch.distributions.Beta(a, b).rsample()


class _DirichletDraw(torch.autograd.Function):
    """``torch.distributions.Dirichlet.rsample`` (its ``_Dirichlet``) with one generator per
    trial: ``concentration`` ``(T, …, K)``, trial t drawn by the same kernel from
    ``generators[t]`` (so a generator seeded with s draws what the global RNG seeded with s
    draws, and a stacked trial draws what it draws alone), and the same reparametrised
    gradient. The draws loop over the trials (the kernel takes one generator); the gradient is
    elementwise and runs once for the whole stack."""

    @staticmethod
    def forward(ctx: Any, concentration: Tensor, generators: list[torch.Generator]) -> Tensor:
        draws = [torch._sample_dirichlet(concentration[t], generator=gen)
                 for t, gen in enumerate(generators)]
        x = torch.stack(draws)
        ctx.save_for_backward(x, concentration)
        return x

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor, None]:
        x, concentration = ctx.saved_tensors
        total = concentration.sum(-1, True).expand_as(concentration)
        grad = torch._dirichlet_grad(x, concentration, total)
        return grad * (grad_output - (x * grad_output).sum(-1, True)), None


def _check_step(what: str, x_train: Tensor, index: Tensor, logits: Tensor,
                observed: Tensor) -> None:
    if logits.ndim != 2 or logits.shape != observed.shape or index.ndim != 1 or (
            index.shape[0] != logits.shape[0]):
        raise LossInputError(
            f"{what}: logits (B, C), observed (B, C) and index (B,) must agree; got "
            f"{tuple(logits.shape)}, {tuple(observed.shape)}, {tuple(index.shape)}")
    if x_train.ndim != 2:
        raise LossInputError(f"{what}: x_train must be the train features (N, d); got shape "
                             f"{tuple(x_train.shape)}")


def smile_step(nets: SmileNetworks, adj: Tensor, x_train: Tensor, index: Tensor, logits: Tensor,
               observed: Tensor, *, p: float, mu: float, rate: float, bias: bool,
               gamma: float, delta: float, temperature: float = 1.0,
               warmup: bool = False) -> tuple[Tensor, Tensor]:
    """One released step's two losses: ``(classifier loss, label-enhancement loss)`` for the
    batch ``index`` with the classifier's ``logits`` ``(B, C)`` and ``observed`` ``(B, C)``
    (1 / 0). ``adj``: :func:`knn_graph` of ``x_train``. ŷ's Beta draw uses the global torch
    generator, as released. ``warmup``: a step of the released warm-up epochs (AN on σ(z) and
    AN on the encoder's σ(GCN(X)[index]), no temperature, no draw)."""
    _check_step("smile_step", x_train, index, logits, observed)
    h = {"p": p, "mu": mu, "rate": rate, "gamma": gamma, "delta": delta,
         "temperature": temperature}
    classifier, enhance = _smile_parts(nets.stacked(), _graph_from_adjacency(adj), x_train,
                                       index, logits.unsqueeze(0), observed, h, bias,
                                       _global_beta, warmup)
    return classifier[0], enhance[0]


def smile(logits: Tensor, observed: Tensor, nets: SmileNetworks, adj: Tensor, x_train: Tensor,
          index: Tensor, *, p: float = 0.5, mu: float = 0.5, rate: float = 1.0,
          bias: bool = True, gamma: float = 0.001, delta: float = 1.0,
          temperature: float = 1.0) -> Tensor:
    """SMILE's loss of one step, the sum of :func:`smile_step`'s two losses (the quantity the
    trainer differentiates; module docstring), with the released script's defaults."""
    return sum(smile_step(nets, adj, x_train, index, logits, observed, p=p, mu=mu, rate=rate,
                          bias=bias, gamma=gamma, delta=delta, temperature=temperature))


# ---------------------------------------------------------------------------------------------
# the registered loss
# ---------------------------------------------------------------------------------------------

_P = HParam("p", 0.5, "D₂'s value on unobserved entries (released default 0.5; yeast 0.05)",
            low=0.0, high=1.0, search=(0.01, 0.5), log=True)
_MU = HParam("mu", 0.5, "weight μ of the enhanced labels d in the target μd + (1−μ)D₂ "
             "(released 0.5)", low=0.0, high=1.0, search=(0.1, 0.9))
_RATE = HParam("rate", 1.0, "weight of the unobserved entries' BCE when bias is off (released "
               "default 1; yeast 0.1)", low=0.0, search=(0.01, 1.0), log=True)
_BIAS = HParam("bias", True, "weight the unobserved entries by 1/(C−1) instead of rate "
               "(released --bias: default 1; yeast 0)", kind="bool")
_GAMMA = HParam("gamma", 0.001, "weight γ of the reconstruction terms (released 0.001)",
                low=0.0, search=(1e-4, 1e-1), log=True)
_DELTA = HParam("delta", 1.0, "weight δ of the Beta KL term (released 1)", low=0.0,
                search=(0.1, 10.0), log=True)
_TEMP = HParam("temperature", 1.0, "temperature T of σ(z/T) for the classifier and the encoder "
               "(released --T 1)", low=0.0, low_open=True)
_K = HParam("neighbours", 3, "k, the neighbours per row of the feature graph (released 3)",
            kind="int", low=1)
_LR_MULT = HParam("lr_mult", 1.0, "learning-rate multiplier of the label-enhancement networks "
                  "relative to the head (released: both at --lr; one value for all stacked "
                  "trials)", low=0.0, low_open=True)
_WARMUP = HParam("warmup", 0, "epochs trained with the released warm-up first: AN on the "
                 "classifier and on the encoder (released --warm_up, default 0)", kind="int",
                 low=0)
_FLOATS = ("p", "mu", "rate", "gamma", "delta", "temperature")


@register
class SMILE(Loss):
    name = "smile"
    paper = PAPER + " (SMILE), as its released code computes it (palm-ml/smile train_smile2.py)"
    formula = (
        "epochs < warmup: AN(σ(z)) + AN(σ(GCN(X_train)[index])) (the released warm-up)\n"
        "A = k-NN graph of the train features;  d = σ(GCN(X_train)[index]/T)  (2 GraphConv "
        "norm='both', ReLU, linear)\n"
        "classifier: D = sg(μd + (1−μ)D₂), D₂ = y with unobserved entries = p;  s = σ(z/T);  "
        "D·(−log(s+ε)) + (1−D)·(−log(1−s+ε)), unobserved × rate (bias off) or × 1/(C−1);  "
        "mean over B·C\n"
        "networks: AN(d) + γ·(‖MLP([d, MLP([x, d])]) − x‖² + AN(ŷ) + ‖ŷŷᵀ − A_batch‖²) + "
        "δ·KL_Beta(d),  ŷ ~ Beta(d+1e-5, 1−d+1e-5) reparametrised\n"
        "loss = classifier + networks (disjoint parameters: one backward = the released two "
        "optimizers)")
    hparam_specs = (_P, _MU, _RATE, _BIAS, _GAMMA, _DELTA, _TEMP, _K, _LR_MULT, _WARMUP)
    presets = {"yeast": {k: SMILE_YEAST[k] for k in ("p", "mu", "rate", "bias")}}
    train_presets = {"yeast": {k: SMILE_YEAST[k] for k in ("batch_size", "lr", "epochs")}}
    stateful = True
    needs_features = True
    # ŷ is drawn from per-trial generators of the loss's own, which a captured CUDA graph
    # would not advance: the step runs eagerly
    host_per_step = True
    trial_state = PARAM_NAMES
    stacks_draws = True  # observed enters only elementwise beside (T, B, C) terms
    version = "1"
    notes = (
        "Reads the train features (needs_features: the trainer hands the unflipped train rows' "
        "D features to set_features once, after setup). The label-enhancement networks are "
        "the loss's own parameters, stacked per trial as (T, in, out) weights and (T, out) "
        "biases (extra_parameters, trained by the trainer's optimizer at lr × lr_mult, no "
        "weight decay; released: Adam at the same lr, no weight decay); T stacked trials equal "
        "T runs alone. Per trial seed s: the networks are drawn as the released "
        "torch.manual_seed(s + 2**33); GCN; MLPNet; Decoder would (dgl GraphConv: "
        "Xavier-uniform weight, zero bias), ŷ's Beta draws come from a generator seeded with "
        "s + 2**34 on the loss's device. The graph (k-NN, euclidean, float64, ties to the "
        "lower row) is built once in set_features, O(N²) distances; the GCN runs on the batch's "
        "2-hop neighbourhood of the graph (released: over all N train rows, then the batch's "
        "rows kept; the same sums, equal to float rounding). Differences from the released "
        "run: the classifier is the probe's linear head, not the released two-layer MLP; the "
        "warm-up epochs count within epochs (released: --warm_up epochs before --ep; 0 in its "
        "default and yeast run); with flip augmentation the networks see the "
        "unflipped features; an observed negative (y = −1, which the released code never "
        "has) counts as observed with D₂ = 0. Nothing is reconstructed: every term is the "
        "released code's (tests/test_losses_smile.py).")

    def __init__(self, **hparams: Any) -> None:
        super().__init__(**hparams)
        self._seeds: list[int] | None = None
        self._gens: list[torch.Generator] | None = None  # made at the first draw
        self._n_train: int | None = None
        self._n_classes = 0

    def setup(self, observed: Tensor, n_epochs: int, n_trials: int | None = None) -> None:
        super().setup(observed, n_epochs, n_trials)
        if isinstance(self.hparam("lr_mult"), Tensor):
            raise LossInputError(
                f"smile: lr_mult must be one value for all stacked trials (the trainer trains a "
                f"loss's parameters at one multiplier); got {self.hparam('lr_mult').tolist()}; "
                "run one probe per value")
        if self.hparam("bias") and observed.shape[-1] < 2:
            raise LossInputError("smile: bias=True weights unobserved entries by 1/(C−1) and "
                                 f"needs C >= 2 classes; got C={observed.shape[-1]}")
        # (N, C), or (T, N, C) per-trial draws (stacks_draws)
        self._n_train, self._n_classes = int(observed.shape[-2]), int(observed.shape[-1])

    def set_features(self, train_x: Tensor) -> None:
        """Receive the train features ``(N_train, D)`` (unflipped, no bias column), once after
        :meth:`setup`: build the feature graph and draw the networks (seeds of
        :meth:`manual_seed`, default 0)."""
        if self._n_train is None:
            raise LossInputError("smile: call setup(observed_train, n_epochs) before "
                                 "set_features(train_x)")
        k = self.hparam("neighbours")
        if not isinstance(train_x, Tensor) or train_x.ndim != 2 or (
                train_x.shape[0] != self._n_train) or not train_x.is_floating_point():
            got = tuple(train_x.shape) if isinstance(train_x, Tensor) else type(train_x).__name__
            raise LossInputError(
                f"smile: set_features needs the train split's features, a float tensor "
                f"({self._n_train}, D) (the rows setup saw, no bias column); got {got}")
        if not k < self._n_train:
            raise LossInputError(f"smile: neighbours={k} needs more than {k} train rows; got "
                                 f"{self._n_train}; lower neighbours")
        x = train_x.detach().to(torch.float32).contiguous()
        graph = graph_of(knn_neighbours(x, k))
        self.register_buffer("x_train", x, persistent=False)
        self.register_buffer("graph_neighbours", graph.neighbours, persistent=False)
        self.register_buffer("graph_index", graph.index, persistent=False)
        self.register_buffer("graph_weight", graph.weight, persistent=False)
        t = self.n_trials or 1
        d, c = x.shape[1], self._n_classes
        for name, shape in network_shapes(d, c).items():
            self.register_parameter(name, nn.Parameter(torch.empty(t, *shape, device=x.device)))
        self._init_networks()

    def _init_networks(self) -> None:
        t = getattr(self, PARAM_NAMES[0]).shape[0]
        seeds = self._seeds or [0] * t
        d, c = self.x_train.shape[1], self.fc_w.shape[-1]
        with torch.no_grad():
            for i, seed in enumerate(seeds):
                for name, value in init_networks(seed + NET_SEED_OFFSET, d, c).items():
                    getattr(self, name)[i].copy_(value)

    def manual_seed(self, seeds: list[int]) -> None:
        """One seed per trial: the networks' initial draw (re-drawn in place if already
        allocated) and ŷ's Beta stream."""
        first = self._parameters.get(PARAM_NAMES[0])
        t = first.shape[0] if first is not None else (self.n_trials or len(seeds))
        if len(seeds) != t:
            raise LossInputError(f"smile: manual_seed needs one seed per trial ({t}); got "
                                 f"{len(seeds)}")
        self._seeds = [int(s) for s in seeds]
        self._gens = None
        if first is not None:
            self._init_networks()

    def select_trials(self, keep: list[int]) -> None:
        super().select_trials(keep)
        if self._seeds is not None:
            self._seeds = [self._seeds[k] for k in keep]
        if self._gens is not None:
            self._gens = [self._gens[k] for k in keep]

    def _networks(self) -> dict[str, Tensor]:
        if PARAM_NAMES[0] not in self._parameters:
            raise LossInputError(
                "smile: call set_features(train_x) after setup() and before the first forward "
                "(the label-enhancement networks read the train features; the trainer does this)")
        return {name: self._parameters[name] for name in PARAM_NAMES}

    def extra_parameters(self) -> list[tuple[nn.Parameter, float]]:
        """The label-enhancement networks' stacked parameters, at ``lr_mult``."""
        mult = float(self.hparam("lr_mult"))
        return [(p, mult) for p in self._networks().values()]

    def _draw_beta(self, a: Tensor, b: Tensor) -> Tensor:
        """ŷ ~ Beta(a, b), reparametrised, trial t from its own generator."""
        if self._gens is None:
            seeds = self._seeds or [0] * a.shape[0]
            self._gens = [torch.Generator(device=a.device).manual_seed(s + BETA_SEED_OFFSET)
                          for s in seeds]
        return _DirichletDraw.apply(torch.stack([a, b], -1), self._gens).select(-1, 0)

    def forward(self, logits: Tensor, observed: Tensor, index: Tensor | None = None) -> LossOutput:
        if index is None:
            raise LossInputError("smile: pass index= (the batch's row numbers in the train "
                                 "split) to forward: the networks read those rows' features")
        params = self._networks()
        z = promote(logits)
        squeeze = z.ndim == 2
        if squeeze:
            z = z.unsqueeze(0)
        h = {name: hp(self.hparam(name), z) for name in _FLOATS}
        graph = _Graph(self.graph_neighbours, self.graph_index, self.graph_weight)
        warmup = self.epoch < self.hparam("warmup")
        classifier, enhance = _smile_parts(params, graph, self.x_train, index, z, observed, h,
                                           self.hparam("bias"), self._draw_beta, warmup)
        if squeeze:
            classifier, enhance = classifier[0], enhance[0]
        return LossOutput(classifier + enhance, {"classifier": classifier, "enhance": enhance})
