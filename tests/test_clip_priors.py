"""``spml priors`` (featurize.priors.clip): a tiny OpenCLIP model with random weights in a file,
offline, on a tiny image folder. The stored prior equals an independent computation with
OpenCLIP's own API (softmax over classes of cosine similarity / T, whole image and tiles); an
interrupted run resumes from its finished blocks; bad requests are refused before anything is
written; the prior trains VLPL and GPR through ``spml probe``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
from fixtures_datasets import interrupted_at, make_folder

import featurize.priors.clip as cp
from probe.errors import SpmlError
from probe.store import open_store
from studies.cli import main

open_clip = pytest.importorskip("open_clip")

TINY = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A 12-image folder, a tiny CLIP checkpoint, and a store featurized from the folder."""
    base = tmp_path_factory.mktemp("clip-priors")
    expected = make_folder(base / "ds", n_images=12, seed=9)
    (base / "spml-prior-vit.json").write_text(json.dumps(TINY))
    open_clip.add_model_config(base / "spml-prior-vit.json")
    torch.manual_seed(3)
    weights = base / "tiny.pt"
    torch.save(open_clip.create_model("spml-prior-vit").state_dict(), weights)
    store = base / "s.zarr"
    assert main(["featurize", "folder", "--root", str(expected["root"]), "--out", str(store),
                 "--backbone", "open_clip:spml-prior-vit", "--weights", str(weights),
                 "--device", "cpu", "--quiet", "--no-flip", "--block-rows", "8"]) == 0
    return expected, weights, store


def _reference(weights: Path, store_path: Path, root: Path, k: int, template: str,
               temperature: float) -> np.ndarray:
    """(N, 1 + k², C) view scores written from the definition with OpenCLIP's own calls."""
    model, _, preprocess = open_clip.create_model_and_transforms(
        "spml-prior-vit", pretrained=str(weights))
    model.eval()
    tokenizer = open_clip.get_tokenizer("spml-prior-vit")
    store = open_store(store_path)
    with torch.no_grad():
        text = model.encode_text(tokenizer([template.format(c.replace("_", " "))
                                            for c in store.class_names]))
        text = text / text.norm(dim=-1, keepdim=True)
        out = []
        for image_id in store.image_ids:
            image = Image.open(Path(root) / image_id).convert("RGB")  # a folder's ids
            w, h = image.size
            views = [image]
            for j in range(k):
                for i in range(k):
                    box = (round(i * w / k), round(j * h / k), round((i + 1) * w / k),
                           round((j + 1) * h / k))
                    views.append(image.crop(box))
            feats = model.encode_image(torch.stack([preprocess(v) for v in views]))
            feats = feats / feats.norm(dim=-1, keepdim=True)
            out.append(torch.softmax(feats @ text.T / temperature, dim=-1).numpy())
    return np.stack(out)


def test_prior_equals_openclip_zero_shot_and_trains(setup, capsys):
    expected, weights, store = setup
    assert main(["priors", str(store), "--model", "open_clip:spml-prior-vit", "--weights",
                 str(weights), "--tiles", "2", "--name", "clip", "--temperature", "0.05",
                 "--device", "auto", "--quiet"]) == 0
    assert "wrote prior 'clip'" in capsys.readouterr().out
    ref = _reference(weights, store, expected["root"], 2, "a photo of a {}.", 0.05)
    prior = open_store(store).prior("clip")
    np.testing.assert_allclose(prior.scores, ref[:, 0], atol=2e-6)
    tiles = ref[:, 1:]
    np.testing.assert_allclose(prior.extras["tile_max"], tiles.max(1), atol=2e-6)
    np.testing.assert_allclose(prior.extras["tile_min"], tiles.min(1), atol=2e-6)
    np.testing.assert_allclose(prior.extras["tile_mean"], tiles.mean(1), atol=2e-6)
    np.testing.assert_allclose(prior.scores.sum(1), 1.0, atol=1e-5)
    assert prior.provenance["model"] == "open_clip:spml-prior-vit"
    assert prior.provenance["tiles"] == "2x2" and prior.provenance["temperature"] == 0.05
    assert not list(store.parent.glob("*.partial"))  # the scratch blocks are gone
    assert main(["probe", str(store), "--loss", "gpr", "--priors", "clip", "--epochs", "2",
                 "--batch-size", "4", "--intervals", "0", "--quiet"]) == 0
    # vlpl reads no tile extras: a prior with them is refused by name, not silently read
    assert main(["probe", str(store), "--loss", "vlpl", "--priors", "clip", "--epochs", "1",
                 "--batch-size", "4", "--intervals", "0", "--quiet"]) == 2
    assert "tile_max, tile_mean, tile_min, which this loss does not read" in (
        capsys.readouterr().err)
    # an existing name is refused without --overwrite, before the model is loaded
    assert main(["priors", str(store), "--model", "open_clip:spml-prior-vit", "--weights",
                 str(weights), "--name", "clip", "--quiet"]) == 2
    assert "already holds a prior 'clip'" in capsys.readouterr().err


def test_an_interrupted_run_resumes_from_its_finished_blocks(setup, tmp_path, monkeypatch):
    expected, weights, store = setup
    monkeypatch.setattr(cp, "BLOCK_ROWS", 4)
    real = cp.view_scores
    # the user stops the run in its third block
    monkeypatch.setattr(cp, "view_scores", interrupted_at(real, 3))
    config = cp.ClipPriorConfig(model="open_clip:spml-prior-vit", weights=str(weights),
                                name="resumed", batch_size=4, progress=False)
    with pytest.raises(KeyboardInterrupt):
        cp.compute_clip_prior(store, config)
    assert "resumed" not in open_store(store).prior_names()  # nothing half-written
    assert len(list(store.with_name(f"{store.name}.priors-resumed.partial").glob("block-*"))) == 2
    monkeypatch.setattr(cp, "view_scores", real)
    result = cp.compute_clip_prior(store, config)
    assert result.blocks_resumed == 2
    ref = _reference(weights, store, expected["root"], 0, "a photo of a {}.", 0.01)
    np.testing.assert_allclose(open_store(store).prior("resumed").scores, ref[:, 0], atol=2e-6)


def test_bad_requests_are_refused_before_anything_is_written(setup, tmp_path, capsys,
                                                             monkeypatch):
    _, weights, store = setup
    before = open_store(store).prior_names()
    cases = [
        (["--model", "timm:resnet10t"], "--model"),
        (["--model", "open_clip:spml-prior-vit", "--prompt", "no slot"], "--prompt"),
        (["--model", "open_clip:spml-prior-vit", "--tiles", "-1"], "--tiles"),
        (["--model", "open_clip:spml-prior-vit", "--temperature", "0"], "--temperature"),
        (["--model", "open_clip:spml-prior-vit", "--name", "bad name"], "--name"),
        (["--model", "open_clip:spml-prior-vit", "--name", "fresh", "--root",
          str(tmp_path / "gone")], "--root"),
    ]
    for extra, word in cases:
        assert main(["priors", str(store), "--weights", str(weights), "--quiet", *extra]) == 2
        assert word in capsys.readouterr().err, extra
    # offline without the pretrained tag's weights: refused by name, nothing left behind
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    assert main(["priors", str(store), "--model", "open_clip:ViT-B-16/openai", "--name",
                 "offline", "--quiet"]) == 2
    assert "open_clip" in capsys.readouterr().err
    assert open_store(store).prior_names() == before
    assert not list(store.parent.glob("*.partial"))
    # a store of imported features has no images to score
    arrays = tmp_path / "a.zarr"
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.normal(size=(30, 4)).astype(np.float32))
    y = np.zeros((30, 3), np.uint8)
    y[np.arange(30), np.arange(30) % 3] = 1
    np.save(tmp_path / "y.npy", y)
    assert main(["import", "arrays", "--features", str(tmp_path / "x.npy"), "--labels",
                 str(tmp_path / "y.npy"), "--name", "arr", "--out", str(arrays), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["priors", str(arrays), "--model", "open_clip:spml-prior-vit", "--weights",
                 str(weights), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "imported features" in err and "--root" in err and "spml import priors" in err
    with pytest.raises(SpmlError, match="--tiles"):
        cp.ClipPriorConfig(model="open_clip:x", tiles=True).validate()


def test_a_store_featurized_from_a_relative_root_is_scored_from_another_directory(
        setup, tmp_path, monkeypatch, capsys):
    """The provenance records the dataset, the image root absolute and resolved, the adapter
    and its options as fields; ``spml priors`` run from another directory finds the images by
    them."""
    from featurize import image_source

    expected, weights, _ = setup
    root = Path(expected["root"])
    monkeypatch.chdir(root.parent)
    store = tmp_path / "rel.zarr"
    assert main(["featurize", "folder", "--root", root.name, "--out", str(store),
                 "--option", "test_fraction=0.25", "--option",
                 f"annotations={root.name}/labels.csv", "--backbone", "open_clip:spml-prior-vit",
                 "--weights", str(weights), "--device", "cpu", "--quiet", "--no-flip",
                 "--block-rows", "8"]) == 0
    prov = open_store(store).provenance
    assert prov["image_root"] == str(root.resolve()) and prov["dataset"] == root.name
    assert prov["adapter"] == "folder" and prov["adapter_options"] == {
        "annotations": str((root / "labels.csv").resolve()), "test_fraction": 0.25}
    source = image_source(prov)
    assert (source.root, source.adapter) == (str(root.resolve()), "folder")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["priors", str(store), "--model", "open_clip:spml-prior-vit", "--weights",
                 str(weights), "--name", "clip", "--quiet"]) == 0, capsys.readouterr().err
    ref = _reference(weights, store, root, 0, "a photo of a {}.", 0.01)
    np.testing.assert_allclose(open_store(store).prior("clip").scores, ref[:, 0], atol=2e-6)


def test_an_older_stores_sentence_still_reads():
    """A store written before the fields: its "images of dataset '…' under …" sentence gives
    the dataset and root (adapter unknown, no options); imported features give None."""
    from featurize import ImageSource, image_source

    old = image_source({"source": "images of dataset 'voc' under /data/VOC2012"})
    assert old == ImageSource("voc", "/data/VOC2012", None, {})
    assert image_source({"source": "imported from Cole et al.'s arrays"}) is None
    assert image_source({}) is None


def test_a_resume_needs_the_same_settings_and_the_scratch_holds_reductions(setup, monkeypatch):
    """An interrupted --tiles 2 run keeps (rows, 4, C) blocks (whole image, tile max, min,
    mean), not (rows, 1 + k², C); resuming it with other tiles, temperature or weights is
    refused naming the flag, and the run of the same settings then resumes."""
    expected, weights, store = setup
    monkeypatch.setattr(cp, "BLOCK_ROWS", 4)
    real = cp.view_scores
    monkeypatch.setattr(cp, "view_scores", interrupted_at(real, 2))
    config = cp.ClipPriorConfig(model="open_clip:spml-prior-vit", weights=str(weights),
                                name="tiled", tiles=2, batch_size=4, progress=False)
    with pytest.raises(KeyboardInterrupt):
        cp.compute_clip_prior(store, config)
    scratch = store.with_name(f"{store.name}.priors-tiled.partial")
    block = np.load(scratch / "block-0.npy")
    assert block.shape == (4, 4, open_store(store).n_classes)
    monkeypatch.setattr(cp, "view_scores", real)
    for change, flag in (({"tiles": 0}, "--tiles"), ({"temperature": 0.05}, "--temperature"),
                         ({"prompt": "an image of {}"}, "--prompt-template")):
        other = cp.ClipPriorConfig(**{**config.__dict__, **change})
        with pytest.raises(cp.ClipPriorError, match=f"{flag} .*then.*now"):
            cp.compute_clip_prior(store, other)
        assert (scratch / "block-0.npy").is_file()  # the refused run left the blocks alone
    result = cp.compute_clip_prior(store, config)
    assert result.blocks_resumed == 1
    ref = _reference(weights, store, expected["root"], 2, "a photo of a {}.", 0.01)
    prior = open_store(store).prior("tiled")
    np.testing.assert_allclose(prior.extras["tile_max"], ref[:, 1:].max(1), atol=2e-6)
    np.testing.assert_allclose(prior.extras["tile_mean"], ref[:, 1:].mean(1), atol=2e-6)


def test_device_is_checked_before_any_image_and_options_share_one_spelling(setup, tmp_path,
                                                                           capsys):
    _, weights, store = setup
    if not torch.cuda.is_available():  # --device cuda here: refused before --root is read
        assert main(["priors", str(store), "--model", "open_clip:spml-prior-vit", "--weights",
                     str(weights), "--device", "cuda", "--root", str(tmp_path / "gone"),
                     "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "--device cuda" in err and "--root" not in err
    assert main(["priors", str(store), "--model", "open_clip:spml-prior-vit", "--weights",
                 str(weights), "--tiles", "3x2", "--quiet"]) == 2
    assert "square grid" in capsys.readouterr().err
    # spml priors' spelling: --prompt-template and --tiles KxK, as spml import priors takes them
    assert main(["priors", str(store), "--model", "open_clip:spml-prior-vit", "--weights",
                 str(weights), "--tiles", "1x1", "--prompt-template", "a photo of {}.",
                 "--name", "spelled", "--quiet"]) == 0
    prov = open_store(store).prior("spelled").provenance
    assert prov["tiles"] == "1x1" and prov["prompt_template"] == "a photo of {}."
    np.save(tmp_path / "s.npy", open_store(store).prior("spelled").scores)
    assert main(["import", "priors", str(store), "--name", "imported", "--from",
                 str(tmp_path / "s.npy"), "--tiles", "4", "--prompt", "a photo of {}."]) == 0
    prov = open_store(store).prior("imported").provenance
    assert prov["tiles"] == "4x4" and prov["prompt_template"] == "a photo of {}."


def test_a_prior_of_random_weights_is_flagged(setup, capsys):
    _, _, store = setup
    assert main(["priors", str(store), "--model", "open_clip:spml-prior-vit", "--weights",
                 "random", "--name", "rnd", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["info", str(store)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(
        "prior       rnd"))
    assert "WARNING: computed with a randomly initialised model" in line
    with pytest.warns(UserWarning, match="prior 'rnd' was computed with a randomly"):
        open_store(store).prior("rnd")
    with pytest.warns(UserWarning, match="randomly initialised"):
        assert main(["probe", str(store), "--loss", "vlpl", "--priors", "rnd", "--epochs", "1",
                     "--batch-size", "4", "--intervals", "0", "--quiet"]) == 0
