"""Library-qualified backbones (docs/backbones.md): ``timm:``, ``open_clip:`` and ``hf:``, each a
tiny architecture with random weights saved to a local file and loaded through the real
``--weights PATH`` path. The stored features equal the library's own forward on the library's
own preprocessing of the same images (float16 storage tolerance, as in test_featurize.py);
provenance round-trips through ``spml info``; ``spml probe`` trains on such a store; missing
weights offline are refused before any store exists. CPU only, no network."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
from fixtures_datasets import make_folder

from featurize.backbones import WeightsError, WeightsNotFoundError, load_backbone
from featurize.extract.images import normalize, pil_transformed
from featurize.extract.run import FeaturizeConfig, featurize_dataset
from probe.errors import SpmlError
from probe.store import open_store
from studies.cli import main

timm = pytest.importorskip("timm")
open_clip = pytest.importorskip("open_clip")
transformers = pytest.importorskip("transformers")

torch.set_num_threads(2)


def _close(stored: np.ndarray, ref: np.ndarray) -> None:
    """float16 storage tolerance (test_featurize.py's module docstring)."""
    stored, ref = stored.astype(np.float64), ref.astype(np.float64)
    tol = 1e-3 * np.abs(ref) + 1e-3 * np.abs(ref).max()
    worst = np.abs(stored - ref) - tol
    assert (worst <= 0).all(), f"max excess over tolerance {worst.max():.3g}"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """10 tiny JPEGs of random sizes (one grayscale, one CMYK) in the image-folder layout."""
    root = tmp_path_factory.mktemp("families") / "ds"
    expected = make_folder(root, n_images=10, seed=4)
    return expected


def _paths(expected: dict) -> list[Path]:
    pool = [Path(p) for p in expected["pool"]["paths"]]
    return pool + [Path(p) for p in expected["test"]["paths"]]


def _library_forward(model, preprocess, paths, flip: bool = False) -> np.ndarray:
    """``model`` on ``preprocess`` of each image; ``flip``: of the mirrored model input (the
    store's flipped features mirror the preprocessed input, after any crop)."""
    x = torch.stack([preprocess(Image.open(p).convert("RGB")) for p in paths])
    with torch.no_grad():
        return model(torch.flip(x, dims=[-1]) if flip else x).numpy()


def _featurize_cli(expected: dict, out: Path, *extra: str) -> int:
    return main(
        ["featurize", "folder", "--root", str(expected["root"]), "--out", str(out),
         "--device", "cpu", "--quiet", "--batch-size", "4", "--block-rows", "8", *extra]
    )


# ----------------------------------------------------------------------------- timm


@pytest.fixture(scope="module")
def resnet10t(tmp_path_factory):
    """timm's resnet10t with seeded random weights, saved with its classifier."""
    torch.manual_seed(11)
    model = timm.create_model("resnet10t").eval()
    path = tmp_path_factory.mktemp("timm") / "resnet10t.pth"
    torch.save(model.state_dict(), path)
    return model, path


@pytest.fixture(scope="module")
def timm_store(folder, resnet10t, tmp_path_factory):
    """``spml featurize folder --backbone timm:resnet10t --weights resnet10t.pth`` (offline)."""
    out = tmp_path_factory.mktemp("timm-store") / "timm.zarr"
    assert _featurize_cli(folder, out, "--backbone", "timm:resnet10t", "--weights",
                          str(resnet10t[1])) == 0
    return out


def test_timm_store_equals_timms_forward_and_trains(folder, resnet10t, timm_store, capsys):
    """The acceptance run: featurize with timm:resnet10t from a local file, offline; spml info
    names timm, the model and the weights' sha256; spml probe trains on the store."""
    model, weights = resnet10t
    out = timm_store
    store = open_store(out)
    # timm's own eval preprocessing and forward without the classifier
    cfg = timm.data.resolve_data_config({}, model=model)
    preprocess = timm.data.create_transform(**cfg)
    plain = timm.create_model("resnet10t", num_classes=0).eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("fc.")})
    paths = _paths(folder)
    for flip in (False, True):
        _close(store.features(flip=flip), _library_forward(plain, preprocess, paths, flip))
    prov = store.provenance
    assert prov["backbone"] == "timm:resnet10t" and prov["backbone_family"] == "timm"
    assert prov["library"].startswith("timm ") and prov["model_id"] == "resnet10t.c3_in1k"
    assert prov["weights_sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert prov["feature_dim"] == store.feature_dim == 512 and prov["embed"] == "pooled"
    transform = prov["transform"]
    assert transform["crop"] == [176, 176] and transform["interpolation"] == "bicubic"
    assert transform["resize"] == "shorter side to 201"  # floor(176 / 0.875)
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    info = capsys.readouterr().out
    assert "timm 1." in info and "resnet10t.c3_in1k" in info and prov["weights_sha256"] in info
    assert main(["probe", str(out), "--loss", "an", "--epochs", "2", "--batch-size", "4",
                 "--quiet"]) == 0
    assert "best" in capsys.readouterr().out


def test_finetune_rebuilds_the_stores_backbone(folder, resnet10t, timm_store, tmp_path, capsys):
    """spml finetune --store: the same timm model, weights file (sha256 checked) and timm's
    preprocessing as the store; other weights than the store's are refused."""
    from studies.finetune.config import store_backbone

    model = store_backbone(timm_store)
    assert model == {"backbone": "timm:resnet10t", "embed": "pooled",
                     "weights": str(resnet10t[1].resolve()), "transform": "model",
                     "weights_sha256": open_store(timm_store).provenance["weights_sha256"]}
    out = tmp_path / "ft"
    assert main(["finetune", "folder", "--root", str(folder["root"]), "--store", str(timm_store),
                 "--loss", "an", "--batch-size", "2", "--max-steps", "1", "--out", str(out),
                 "--no-progress", "--json", "--device", "cpu"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"]["backbone"] == "timm:resnet10t"
    assert result["model"]["weights_sha256"] == model["weights_sha256"]
    assert result["model"]["head"] == "Linear(512, 4)" and result["global_step"] == 1
    assert result["model"]["transform"]["crop"] == [176, 176]
    torch.save(timm.create_model("resnet10t").state_dict(), tmp_path / "other.pth")
    from studies.finetune.run import FinetuneConfig as FC
    from studies.finetune.run import FinetuneError, finetune

    with pytest.raises(FinetuneError, match="sha256"):
        finetune(FC(dataset="folder", root=folder["root"], loss="an", out=tmp_path / "ft2",
                    backbone="timm:resnet10t", weights=str(tmp_path / "other.pth"),
                    weights_sha256=model["weights_sha256"], progress=False, device="cpu"))


def test_finetune_reads_the_stores_images_and_follows_a_studys_store(folder, resnet10t,
                                                                     timm_store, tmp_path,
                                                                     capsys, monkeypatch):
    """spml finetune --store with no dataset or --root: the adapter, the image root (absolute)
    and its options come from the store's provenance. spml finetune --from-study on a study of
    the timm store rebuilds timm:resnet10t from that store (not ResNet-50's weights), from
    another directory too."""
    out = tmp_path / "ft"
    assert main(["finetune", "--store", str(timm_store), "--loss", "an", "--batch-size", "2",
                 "--max-steps", "1", "--out", str(out), "--no-progress", "--json",
                 "--device", "cpu"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["config"]["dataset"] == "folder"
    assert result["config"]["root"] == str(Path(folder["root"]).resolve())
    assert result["model"]["backbone"] == "timm:resnet10t"
    study = tmp_path / "study"
    assert main(["study", str(timm_store), "--loss", "an", "--trials", "2", "--epochs", "1",
                 "--batch-size", "2", "--search-lr", "--out", str(study)]) == 0
    capsys.readouterr()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["finetune", "--from-study", str(study), "--batch-size", "2", "--max-steps",
                 "1", "--out", str(tmp_path / "ft-study"), "--no-progress", "--json",
                 "--device", "cpu"]) == 0, capsys.readouterr().err
    result = json.loads(capsys.readouterr().out)
    assert result["loss"] == "an" and result["model"]["backbone"] == "timm:resnet10t"
    assert result["model"]["weights_sha256"] == open_store(timm_store).provenance[
        "weights_sha256"]
    assert result["model"]["head"] == "Linear(512, 4)" and result["global_step"] == 1


def test_timm_weights_without_classifier_and_wrong_files(resnet10t, tmp_path):
    model, _ = resnet10t
    trunk = tmp_path / "trunk.safetensors"
    from safetensors.torch import save_file

    save_file({k: v for k, v in model.state_dict().items() if not k.startswith("fc.")}, trunk)
    backbone = load_backbone("timm:resnet10t", str(trunk))
    assert backbone.weights.id == "file:trunk.safetensors" and backbone.feature_dim == 512
    other = tmp_path / "other.pth"
    torch.save(timm.create_model("resnet14t").state_dict(), other)
    with pytest.raises(WeightsError, match="does not fit"):
        load_backbone("timm:resnet10t", str(other))
    with pytest.raises(SpmlError, match="Did you mean"):
        load_backbone("timm:resnet10tt", "random")
    with pytest.raises(SpmlError, match="no pretrained tag"):
        load_backbone("timm:resnet10t.nope", "random")


def test_timm_offline_without_weights_is_refused(folder, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    with pytest.raises(WeightsNotFoundError, match=r"timm/resnet10t\.c3_in1k.*HF_HUB_OFFLINE"):
        featurize_dataset("folder", folder["root"], tmp_path / "s.zarr",
                          FeaturizeConfig(backbone="timm:resnet10t", device="cpu"))
    assert not (tmp_path / "s.zarr").exists()


# ----------------------------------------------------------------------------- OpenCLIP

_TINY_CLIP = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 8,
                   "head_width": 16},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2,
                 "layers": 1},
}


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    """A tiny OpenCLIP ViT registered from a JSON config, with random weights in a file."""
    folder = tmp_path_factory.mktemp("open_clip")
    (folder / "spml-tiny-vit.json").write_text(json.dumps(_TINY_CLIP))
    open_clip.add_model_config(folder / "spml-tiny-vit.json")
    torch.manual_seed(12)
    model = open_clip.create_model("spml-tiny-vit")
    path = folder / "tiny.pt"
    torch.save(model.state_dict(), path)
    return path


def test_open_clip_store_equals_encode_image(folder, tiny_clip, tmp_path):
    out = tmp_path / "clip.zarr"
    assert _featurize_cli(folder, out, "--backbone", "open_clip:spml-tiny-vit", "--weights",
                          str(tiny_clip), "--no-flip") == 0
    model, _, preprocess = open_clip.create_model_and_transforms(
        "spml-tiny-vit", pretrained=str(tiny_clip)
    )
    model.eval()
    store = open_store(out)
    _close(store.features(), _library_forward(model.encode_image, preprocess, _paths(folder)))
    prov = store.provenance
    assert prov["embed"] == "projected" and store.feature_dim == 16
    assert prov["library"].startswith("open_clip_torch ")
    assert prov["transform"]["mean"] == pytest.approx([0.48145466, 0.4578275, 0.40821073])
    # the pooled output before the projection: the ViT without visual.proj
    pooled = load_backbone("open_clip:spml-tiny-vit", str(tiny_clip), embed="pooled")
    visual = model.visual
    visual.proj = None
    x = torch.stack([preprocess(Image.open(p).convert("RGB")) for p in _paths(folder)[:3]])
    with torch.no_grad():
        torch.testing.assert_close(pooled.features(x), visual(x))
    assert pooled.feature_dim == 32
    # the store holds the projected embedding: a run asking for another one does not resume it
    with pytest.raises(SpmlError, match="'projected' embedding"):
        featurize_dataset("folder", folder["root"], out, FeaturizeConfig(
            backbone="open_clip:spml-tiny-vit", weights=str(tiny_clip), embed="pooled",
            device="cpu", with_flip=False, block_rows=8, progress=False))


def test_load_clip_gives_both_towers_tokenizer_and_preprocess(tiny_clip):
    from featurize.backbones import load_clip

    clip = load_clip("open_clip:spml-tiny-vit", str(tiny_clip))
    reference = open_clip.create_model("spml-tiny-vit", pretrained=str(tiny_clip)).eval()
    tokens = clip.tokenizer(["a photo of a cat", "a dog"])
    with torch.no_grad():
        torch.testing.assert_close(clip.model.encode_text(tokens), reference.encode_text(tokens))
    image = Image.new("RGB", (40, 30), (200, 10, 60))
    assert clip.preprocess(image).shape == (3, 32, 32)
    assert clip.transform.out_size == 32
    assert clip.provenance()["weights_sha256"] == hashlib.sha256(
        tiny_clip.read_bytes()).hexdigest()


def test_open_clip_offline_is_refused_by_name_before_any_store(folder, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    out = tmp_path / "clip.zarr"
    with pytest.raises(WeightsNotFoundError) as err:
        featurize_dataset("folder", folder["root"], out,
                          FeaturizeConfig(backbone="open_clip:ViT-B-16/openai", device="cpu"))
    text = str(err.value)
    assert "timm/vit_base_patch16_clip_224.openai" in text and "open_clip_model.safetensors" in text
    assert str(tmp_path / "hf" / "hub") in text and "--weights PATH" in text
    assert not out.exists() and not (tmp_path / "hf").exists()
    # the same through the CLI: one line, exit 2, nothing written
    assert _featurize_cli(folder, out, "--backbone", "open_clip:ViT-B-16/openai") == 2
    assert not out.exists()


def test_unreachable_hub_is_refused_after_one_check(folder, tmp_path, monkeypatch, capfd):
    """Without HF_HUB_OFFLINE, weights that are not cached and a hub that cannot be reached:
    one connectivity check, then the refusal saying what spml checked -- no retry loop, none of
    the hub library's lines, nothing written (timm and OpenCLIP, featurize and load_clip)."""
    from featurize.backbones import load_clip

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    for key in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://spml-hub.invalid")  # never resolves (RFC 2606)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    for backbone in ("open_clip:ViT-B-32/openai", "timm:resnet10t"):
        out = tmp_path / "s.zarr"
        capfd.readouterr()
        assert _featurize_cli(folder, out, "--backbone", backbone) == 2, backbone
        err = capfd.readouterr().err
        assert "spml checked the connection to spml-hub.invalid:443 and it failed" in err
        assert "this machine looks offline" in err and "--weights PATH" in err
        assert "Retrying" not in err and "thrown while requesting" not in err
        assert err.count("\n") == 1, err  # the one spml line
        assert not out.exists() and not (tmp_path / "hf").exists()
    with pytest.raises(WeightsNotFoundError, match="spml checked the connection"):
        load_clip("open_clip:ViT-B-32/openai")  # spml priors' model


# ----------------------------------------------------------------------------- Hugging Face


@pytest.fixture(scope="module")
def tiny_dinov2(tmp_path_factory):
    """A tiny DINOv2 (transformers) saved with its image processor; weights in a separate file."""
    folder = tmp_path_factory.mktemp("hf") / "dinov2-tiny"
    config = transformers.Dinov2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        patch_size=8, image_size=32,
    )
    torch.manual_seed(13)
    model = transformers.Dinov2Model(config).eval()
    model.save_pretrained(folder)
    weights = folder.parent / "dinov2-tiny.safetensors"
    (folder / "model.safetensors").rename(weights)
    processor = transformers.BitImageProcessor(
        size={"shortest_edge": 40}, crop_size={"height": 32, "width": 32},
        image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225],
    )
    processor.save_pretrained(folder)
    return folder, weights


def test_hf_store_equals_transformers_forward(folder, tiny_dinov2, tmp_path):
    repo, weights = tiny_dinov2
    out = tmp_path / "hf.zarr"
    config = FeaturizeConfig(backbone=f"hf:{repo}", weights=str(weights), device="cpu",
                             batch_size=4, block_rows=8, progress=False)
    featurize_dataset("folder", folder["root"], out, config)
    store = open_store(out)
    (repo / "model.safetensors").symlink_to(weights)
    try:
        model = transformers.Dinov2Model.from_pretrained(repo).eval()
    finally:
        (repo / "model.safetensors").unlink()
    processor = transformers.BitImageProcessor.from_pretrained(repo)

    def preprocess(image):
        return processor(images=image, return_tensors="pt")["pixel_values"][0]

    def pooled(x):
        return model(pixel_values=x).pooler_output

    for flip in (False, True):
        _close(store.features(flip=flip), _library_forward(pooled, preprocess, _paths(folder),
                                                           flip))
    prov = store.provenance
    assert prov["library"].startswith("transformers ") and prov["model_class"] == "Dinov2Model"
    assert prov["embed"] == "pooled" and store.feature_dim == 32
    assert prov["transform"]["crop"] == [32, 32]
    assert prov["transform"]["crop_offset"] == "(resized - crop) // 2"
    with pytest.raises(SpmlError, match="--embed 'projected'"):
        load_backbone(f"hf:{repo}", str(weights), embed="projected")
    from safetensors.torch import load_file, save_file

    part = {k: v for k, v in load_file(str(weights)).items() if ".layer.1." not in k}
    save_file(part, str(tmp_path / "part.safetensors"))
    with pytest.raises(WeightsError, match="missing keys"):
        load_backbone(f"hf:{repo}", str(tmp_path / "part.safetensors"))


def test_hf_clip_projected_from_a_whole_clip_checkpoint(folder, tmp_path):
    """A whole CLIPModel checkpoint (text tower included) loads into the vision tower with its
    projection: --embed projected (the default for CLIP) is transformers' image_embeds, pooled
    its pooler_output; the image processor's resize/crop/mean/std are the preprocessing."""
    repo = tmp_path / "clip-tiny"
    config = transformers.CLIPConfig(
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "vocab_size": 99, "max_position_embeddings": 16},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                       "num_attention_heads": 2, "image_size": 32, "patch_size": 8},
        projection_dim=24,
    )
    torch.manual_seed(14)
    transformers.CLIPModel(config).save_pretrained(repo)
    processor = transformers.CLIPImageProcessor(size={"shortest_edge": 32},
                                                crop_size={"height": 32, "width": 32})
    processor.save_pretrained(repo)
    weights = repo / "model.safetensors"
    projected = load_backbone(f"hf:{repo}", str(weights))
    pooled = load_backbone(f"hf:{repo}", str(weights), embed="pooled")
    assert (projected.embed, projected.feature_dim, pooled.feature_dim) == ("projected", 24, 32)
    assert projected.transform.mean == pytest.approx(processor.image_mean)
    reference = transformers.CLIPModel.from_pretrained(repo).eval()  # both towers
    paths = _paths(folder)[:4]
    x = torch.stack([processor(images=Image.open(p).convert("RGB"), return_tensors="pt")
                     ["pixel_values"][0] for p in paths])
    ours = torch.stack([
        torch.from_numpy(pil_transformed(p, projected.transform).copy()) for p in paths
    ]).permute(0, 3, 1, 2)
    ours = normalize(ours, projected.transform)
    torch.testing.assert_close(ours, x, atol=2e-2, rtol=0)  # one grey level
    with torch.no_grad():
        pooler = reference.vision_model(pixel_values=x).pooler_output
        torch.testing.assert_close(pooled.features(x), pooler)
        # CLIP's image features: the pooled output through the visual projection
        torch.testing.assert_close(projected.features(x), reference.visual_projection(pooler))


def test_hf_offline_without_files_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    with pytest.raises(WeightsNotFoundError, match=r"config\.json.*facebook/dinov2-small"):
        load_backbone("hf:facebook/dinov2-small")


# ----------------------------------------------------------------------------- preprocessing


@pytest.mark.parametrize("rounding", ["round", "floor"])
def test_torch_resize_and_crop_match_pil(folder, rounding):
    """The torchvision decode path's shorter-side resize and centre crop (bicubic) against the
    PIL reference path, image by image: the same window (on these pure-noise images a window
    one pixel off differs by tens of grey levels on average), pixels within a grey level on
    average (libjpeg-turbo vs PIL's decoder, and bicubic overshoot clipped differently, make a
    few pixels differ more)."""
    from featurize.extract.images import ImageTransform, cpu_decode, pil_transformed, resize_batch

    transform = ImageTransform(size=41, crop=33, interpolation="bicubic", resize="shortest",
                               crop_rounding=rounding)
    paths = _paths(folder)
    images = [cpu_decode(bytearray(p.read_bytes()), p) for p in paths]
    got = resize_batch(images, transform)
    assert got.shape == (len(paths), 3, 33, 33)
    for i, p in enumerate(paths):
        ref = torch.from_numpy(pil_transformed(p, transform).copy()).permute(2, 0, 1)
        diff = (got[i].int() - ref.int()).abs()
        assert diff.float().mean() < 1.0 and diff.max() <= 32, (p, diff.max())


def test_transform_geometry_rules():
    from featurize.extract.images import ImageTransform

    t = ImageTransform(size=256, crop=224, resize="shortest")
    assert t.resized_shape(480, 640) == (256, 341)  # torchvision: int(256 * 640 / 480)
    assert t.crop_box(256, 341) == (16, 58)  # round(117 / 2) = 58 (half to even)
    floor = ImageTransform(size=256, crop=224, resize="shortest", crop_rounding="floor")
    assert floor.crop_box(256, 341) == (16, 58) and floor.crop_box(257, 341) == (16, 58)
    assert t.crop_box(257, 341) == (16, 58)  # round(16.5) = 16
    assert t.crop_box(259, 341) == (18, 58) and floor.crop_box(259, 341) == (17, 58)
    with pytest.raises(SpmlError, match="crop must be between"):
        ImageTransform(size=200, crop=224, resize="shortest")
    assert ImageTransform(size=32).describe()["crop"] is None


# ----------------------------------------------------------------------------- the registry


def test_families_listed_and_names_checked(capsys):
    assert main(["backbones"]) == 0
    text = capsys.readouterr().out
    for word in ("timm:", "open_clip:", "hf:", "pip install -e '.[clip]'", "resnet50"):
        assert word in text
    with pytest.raises(SystemExit) as done:
        main(["featurize", "--list-backbones"])
    assert done.value.code == 0 and "open_clip:" in capsys.readouterr().out
    assert main(["backbones", "--json"]) == 0
    families = {f["family"]: f for f in json.loads(capsys.readouterr().out)}
    assert families["timm"]["installed"] and families["torchvision"]["installed"]
    with pytest.raises(SpmlError, match="unknown library 'keras'"):
        load_backbone("keras:resnet50", "random")
    with pytest.raises(SpmlError, match="--transform model"):
        featurize_dataset("folder", "/nonexistent", "/tmp/x.zarr",
                          FeaturizeConfig(backbone="resnet18", transform="model"))
    with pytest.raises(SpmlError, match="--size 64"):
        featurize_dataset("folder", "/nonexistent", "/tmp/x.zarr",
                          FeaturizeConfig(backbone="timm:resnet10t", size=64))


@pytest.mark.gpu
def test_fast_gpu_path_takes_a_family(folder, resnet10t, timm_store, tmp_path):
    """The GPU fast path (nvJPEG decode, bicubic resize and crop on the device, bf16 autocast,
    channels_last) on a timm backbone: within cosine 0.99 of the CPU reference store."""
    out = tmp_path / "gpu.zarr"
    featurize_dataset("folder", folder["root"], out, FeaturizeConfig(
        backbone="timm:resnet10t", weights=str(resnet10t[1]), device="cuda",
        decode="torchvision", precision="bf16", progress=False, overwrite=True))
    fast, ref = open_store(out).features(), open_store(timm_store).features()
    a, b = fast.astype(np.float64), ref.astype(np.float64)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert cos.min() > 0.99
