"""What every backbone family shares (docs/backbones.md): the loaded :class:`Backbone`, its
:class:`WeightsInfo` and errors, reading a checkpoint, the Hugging Face hub cache (timm, OpenCLIP
and transformers fetch their weights through it) and the input-size check.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.metadata
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from featurize.extract.images import ImageTransform
from featurize.specs import DEFAULT, BackboneSpec
from probe.errors import SpmlError

#: checkpoint suffixes a ``--weights PATH`` may have (any existing file is tried as well)
WEIGHT_SUFFIXES: tuple[str, ...] = (".pth", ".pt", ".bin", ".ckpt", ".safetensors")


class WeightsError(SpmlError):
    """Weights that cannot be used: unknown name, wrong architecture, corrupt file."""


class WeightsNotFoundError(WeightsError, FileNotFoundError):
    """The pretrained weights file is not on this machine."""


@dataclass(frozen=True)
class WeightsInfo:
    """Which weights a backbone carries (goes into the store's provenance)."""

    id: str  # "imagenet1k_v1", "imagenet" (lite0 package), "file:<name>", "random(seed=N)", a tag
    sha256: str | None  # of the weights file; None for random weights
    path: str | None
    random: bool  # seeded random initialisation, NOT pretrained
    seed: int | None = None
    url: str | None = None  # where the file comes from (torchvision's URL, a hub repo)


@dataclass
class Backbone:
    """A loaded, frozen backbone: ``features(x) -> (B, D)`` embeddings; ``head`` the removed
    ImageNet classifier (torchvision families), ``transform`` the model's own preprocessing
    (None: the protocol's only), ``details`` the family's provenance (library, model id, ...)."""

    spec: BackboneSpec
    features: nn.Module
    head: nn.Module | None
    weights: WeightsInfo
    transform: ImageTransform | None = None
    embed: str = "pooled"
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def feature_dim(self) -> int:
        return self.spec.feature_dim

    def to(self, device: torch.device | str, channels_last: bool = False) -> Backbone:
        fmt = torch.channels_last if channels_last else torch.preserve_format
        self.features.to(device=device, memory_format=fmt)
        if self.head is not None:
            self.head.to(device=device)
        return self

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        """ImageNet logits from pooled features (the classifier the features feed)."""
        if self.head is None:
            raise SpmlError(f"backbone {self.name!r} keeps no ImageNet classifier to classify with")
        param = next(self.head.parameters())
        with torch.inference_mode():
            return self.head(features.to(device=param.device, dtype=param.dtype))

    def provenance(self) -> dict:
        """The backbone/weights part of the store's provenance (docs/backbones.md)."""
        w = self.weights
        out = {"backbone": self.name, "backbone_family": self.spec.family,
               "feature_dim": self.feature_dim, "pooling": "global average pool",
               "weights": w.id, "weights_sha256": w.sha256, "weights_file": w.path,
               "weights_url": w.url, "weights_random": w.random}
        if self.details:
            out["pooling"] = self.details.get("embedding", out["pooling"])
            out["embed"] = self.embed
            out.update({k: v for k, v in self.details.items() if k != "embedding"})
        return out


def package_version(name: str) -> str:
    """``"name version"`` of an installed distribution (recorded in the provenance)."""
    try:
        return f"{name} {importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        return f"{name} (not installed)"


def random_info(seed: int) -> WeightsInfo:
    return WeightsInfo(id=f"random(seed={int(seed)})", sha256=None, path=None, random=True,
                       seed=int(seed))


def seeded(seed: int, build: Callable[..., Any], *args: Any) -> Any:
    """``build(*args)`` with torch's RNG seeded by ``seed`` (a network's default initialisation
    is then reproducible); the global RNG state is restored after."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        return build(*args)


def did_you_mean(name: str, names: Iterable[str]) -> str:
    """`` Did you mean a, b?`` naming the known names closest to ``name`` (or "")."""
    close = difflib.get_close_matches(name, list(names), n=3)
    return f" Did you mean {', '.join(close)}?" if close else ""


def check_model(name: str, library: str, kind: str, arch: str, known: bool,
                archs: Callable[[], list[str]], tag: str | None,
                tags: Callable[[], list[str]], listing: str) -> None:
    """Refuse backbone ``name`` when ``library`` has no ``kind`` ``arch`` (not ``known``; the
    closest of ``archs()`` and ``listing`` named) or ``arch`` has no pretrained ``tag``."""
    if not known:
        raise SpmlError(f"--backbone {name!r}: {library} has no {kind} {arch!r}."
                        f"{did_you_mean(arch, archs())} {listing}")
    if tag and tag not in (names := tags()):
        raise SpmlError(f"--backbone {name!r}: {library}'s {arch} has no pretrained tag {tag!r}; "
                        f"its tags: {', '.join(names) or 'none'}")


def measured(spec: BackboneSpec, features: nn.Module, info: WeightsInfo,
             transform: ImageTransform | None, embed: str, details: dict[str, Any],
             side: int | None = None) -> Backbone:
    """The frozen :class:`Backbone` of a library-qualified family's network ``features`` (no
    classifier kept): its width measured on one ``side``×``side`` image (default: the
    ``transform``'s input), the spec taking the ``transform``'s mean and std."""
    features.eval().requires_grad_(False)
    dim = input_check(features, side or transform.out_size, spec.name)
    stats = {} if transform is None else {"mean": transform.mean, "std": transform.std}
    spec = dataclasses.replace(spec, feature_dim=dim, **stats)
    return Backbone(spec, features, None, info, transform=transform, embed=embed, details=details)


def pooled_only(embed: str | None, gives: str) -> None:
    """Refuse an ``--embed`` other than the pooled one of a family that ``gives`` only that."""
    if embed not in (None, "auto", "pooled"):
        raise SpmlError(f"--embed {embed!r}: {gives}")


def file_info(path: Path, wid: str, url: str | None = None) -> WeightsInfo:
    """A weights file on disk, its sha256 taken now."""
    from probe.store import file_sha256

    return WeightsInfo(id=wid, sha256=file_sha256(path), path=str(path), random=False, url=url)


def as_weights_path(weights: str) -> Path | None:
    """``weights`` as a file path (a checkpoint suffix or an existing path), else None; a path
    that does not exist is an error naming it."""
    path = Path(weights).expanduser()
    if path.suffix in WEIGHT_SUFFIXES or path.exists():
        if not path.is_file():
            raise WeightsNotFoundError(f"weights file {path} does not exist (--weights)")
        return path.resolve()
    return None


def local_weights(name: str, weights: str | None, default: str, suffixes: str
                  ) -> WeightsInfo | None:
    """``--weights`` as a local checkpoint of backbone ``name``, or None for the default weights
    (None or "default"); anything else is refused, naming ``default`` and the ``suffixes``."""
    if weights in (None, DEFAULT):
        return None
    path = as_weights_path(str(weights))
    if path is None:
        raise WeightsError(f"--weights {weights!r} for {name}: expected default ({default}), "
                           f"a checkpoint file ({suffixes}) or random")
    return file_info(path, f"file:{path.name}")


def read_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The ``state_dict`` of a ``.safetensors`` file or of a torch file (also under ``state_dict``
    or ``model``), read without unpickling code."""
    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state: Any = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except ImportError:
        raise WeightsError(f"weights file {path} is a safetensors file: pip install safetensors "
                           "(or pip install -e '.[hf]')") from None
    except Exception as err:  # unpickling errors come in many types
        raise WeightsError(f"cannot read weights file {path}: {err}") from None
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise WeightsError(f"weights file {path} holds a {type(state).__name__}, not a state_dict")
    return state


def load_into(model: nn.Module, state: dict, path: str | Path, name: str) -> Any:
    """``model.load_state_dict(state, strict=False)``, a tensor of another shape refused as a
    :class:`WeightsError` naming the file; returns the result (for :func:`check_fit`)."""
    try:
        return model.load_state_dict(state, strict=False)
    except RuntimeError as err:  # size mismatches
        first = str(err).split("\n\t")[1:2] or [str(err)]
        raise WeightsError(f"weights file {path} does not fit backbone {name!r}: {first[0]}"
                           ) from None


def check_fit(result: Any, path: str | Path, name: str) -> None:
    """Refuse a ``load_state_dict(strict=False)`` result with missing or unexpected keys, naming
    how many of each (only the kinds that occur) and the first few."""
    from probe.progress import plural

    parts = []
    for kind in ("missing keys", "unexpected keys"):
        keys = list(getattr(result, kind.replace(" ", "_"), ()) or ())
        if keys:
            parts.append(f"{plural(len(keys), kind)} (e.g. {', '.join(map(str, keys[:3]))})")
    if parts:
        raise WeightsError(f"weights file {path} does not fit backbone {name!r}: "
                           f"{'; '.join(parts)}; pass this model's own checkpoint as --weights")


def input_check(features: nn.Module, size: int, name: str, hint: str = "") -> int:
    """The embedding width of ``features``, measured on one black ``size``×``size`` image (CPU,
    no grad): a network that cannot take this size (a ViT's fixed positions) is refused."""
    try:
        with torch.no_grad():
            out = features.eval()(torch.zeros(1, 3, int(size), int(size)))
    except (RuntimeError, AssertionError, ValueError, IndexError) as err:
        raise SpmlError(f"backbone {name!r} cannot take {size}x{size} images: {err}{hint}"
                        ) from None
    if out.ndim != 2 or out.shape[0] != 1:
        raise SpmlError(f"backbone {name!r}: its embedding has shape {tuple(out.shape)}, "
                        "expected (1, D)")
    return int(out.shape[1])


# ----------------------------------------------------------------------------- the hub cache

_TRUE = ("1", "true", "yes", "on")


def hf_offline() -> bool:
    """Offline as the Hugging Face libraries understand it (``HF_HUB_OFFLINE=1`` or
    ``TRANSFORMERS_OFFLINE=1``), read now (the libraries read it once, at import)."""
    return any(os.environ.get(k, "").strip().lower() in _TRUE
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache: ``$HF_HUB_CACHE``, ``$HF_HOME/hub`` or
    ``~/.cache/huggingface/hub``, read from the environment now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


CONNECT_TIMEOUT = 3.0  # seconds before a download is refused as offline (not a minute of retries)
_REACHED: dict[tuple[str, int], str | None] = {}  # (host, port) -> None (reached) or the error


def unreachable(url: str) -> str | None:
    """None when a TCP connection to ``url``'s host (or the HTTPS proxy) opens within
    :data:`CONNECT_TIMEOUT` seconds (checked once per process and host), else a sentence saying
    what was checked and what happened."""
    import socket
    import threading
    from urllib.parse import urlsplit

    proxy = next((os.environ[k] for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                                          "all_proxy") if os.environ.get(k)), None)
    if not proxy:
        target = urlsplit(url)
    elif "://" in proxy:
        target = urlsplit(proxy)
    else:  # a bare host:port proxy
        target = urlsplit(f"http://{proxy}")
    host = target.hostname or ""
    port = target.port or (443 if target.scheme == "https" else 80)
    key = (host, port)
    if key not in _REACHED:
        outcome: list[str | None] = []

        def connect() -> None:
            try:
                socket.create_connection(key, timeout=CONNECT_TIMEOUT).close()
                outcome.append(None)
            except OSError as err:
                outcome.append(f"{type(err).__name__}: {err}")

        worker = threading.Thread(target=connect, daemon=True)  # a name lookup may hang too
        worker.start()
        worker.join(CONNECT_TIMEOUT + 0.5)
        _REACHED[key] = outcome[0] if outcome else f"no answer in {CONNECT_TIMEOUT:g} s"
    error = _REACHED[key]
    if error is None:
        return None
    via = f"the proxy {host}:{port} (HTTPS_PROXY)" if proxy else f"{host}:{port}"
    return f"spml checked the connection to {via} and it failed ({error})"


def fetch_once(url: str, path: Path, what: str, cache: str, fix: str,
               download: Callable[[], Any]) -> Path:
    """``path``, a file of ``cache`` (its description), fetched from ``url`` by ``download()``
    into its folder (made first) when it is not there yet; offline, or when the download fails,
    a :class:`WeightsNotFoundError` naming the file, the cache and ``fix``."""
    if path.is_file():
        return path
    offline = "HF_HUB_OFFLINE is set" if hf_offline() else unreachable(url)
    if offline is not None:
        raise WeightsNotFoundError(
            f"{what} needs {path.name} in {cache}, and {offline}: fetch {url} on a connected "
            f"machine and copy it there, or {fix}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return Path(download() or path)
    except Exception as err:
        raise WeightsNotFoundError(f"{what} needs {path} ({cache}); downloading {url} failed "
                                   f"({err}); copy the file there, or {fix}") from None


def hub_file(repo: str, filenames: tuple[str, ...], what: str, fix: str) -> Path:
    """The first of ``filenames`` of hub repo ``repo`` in the cache, else downloaded into it;
    offline, or when that fails, a :class:`WeightsNotFoundError` naming file, cache and ``fix``."""
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
    except ImportError:
        raise WeightsError(f"{what} comes from the Hugging Face hub: pip install huggingface_hub"
                           ) from None
    cache = hf_cache_dir()
    for filename in filenames:
        found = try_to_load_from_cache(repo, filename, cache_dir=str(cache))
        if isinstance(found, str) and os.path.isfile(found):
            return Path(found)
    missing = (f"{what} needs the file {' or '.join(filenames)} of the Hugging Face repo {repo}, "
               f"which is not in the cache {cache} (set HF_HOME or HF_HUB_CACHE to use another)")
    endpoint = os.environ.get("HF_ENDPOINT", "").strip().rstrip("/") or "https://huggingface.co"
    offline = "HF_HUB_OFFLINE is set" if hf_offline() else unreachable(endpoint)
    if offline is not None:
        offline += "" if hf_offline() else ": this machine looks offline"
        raise WeightsNotFoundError(
            f"{missing}, and {offline}. Run the same command once on a connected machine (it "
            f"downloads into that cache) and copy the cache here, or {fix}")
    from huggingface_hub.utils import logging as hub_logging

    errors, verbosity = [], hub_logging.get_verbosity()
    hub_logging.set_verbosity_error()  # no retry lines
    try:
        for filename in filenames:
            try:
                return Path(hf_hub_download(repo, filename, cache_dir=str(cache)))
            except Exception as err:  # not in the repo, no network, gated, ...: try the next
                errors.append(f"{filename}: {type(err).__name__}: "
                              f"{str(err).splitlines()[0][:200]}")
    finally:
        hub_logging.set_verbosity(verbosity)
    raise WeightsNotFoundError(f"{missing}, and downloading it failed ({'; '.join(errors)}). "
                               f"Connect this machine or copy the cache from one that has it, or "
                               f"{fix}")
