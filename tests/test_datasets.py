"""Dataset adapters (docs/protocol.md "Official dataset layouts"): tiny datasets in the real on-disk
formats, checked against hand-derived answers (literal files below) and against the builders of
``fixtures_datasets`` (generated ground truth), plus every documented error."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from featurize.datasets import (
    DATASETS,
    DatasetEntry,
    DatasetFormatError,
    UnknownDatasetError,
    list_datasets,
    load_dataset,
)
from featurize.datasets.nus import normalize_nus_entry
from featurize.datasets.voc import VOC_CLASSES

sys.path.insert(0, str(Path(__file__).parent))
from fixtures_datasets import (
    assert_index_matches,
    make_coco,
    make_cub,
    make_folder,
    make_nus,
    make_voc,
)


def _raises(exc, path: Path | str, line: int | None = None, *more: str):
    """pytest.raises matching ``path:line`` (or just the path) and the further fragments."""
    parts = [re.escape(f"{path}:{line}" if line is not None else str(path))]
    parts += [re.escape(m) for m in more]
    return pytest.raises(exc, match="(?s)" + ".*".join(parts))


# --------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------


def test_registry_names_and_summaries():
    assert list_datasets() == ["voc", "coco", "nus", "cub", "folder", "cole"]
    assert all(e.summary and ":" in e.target for _, e in DATASETS.items())
    assert DATASETS.get("cole").target == "featurize.datasets.cole:load_cole_formatted"


def test_registry_imports_adapters_lazily():
    code = (
        "import json, sys, featurize; before = set(sys.modules); import featurize.datasets; "
        "print(json.dumps(sorted(m for m in set(sys.modules) - before if 'featurize' in m)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert set(json.loads(out.stdout)) <= {
        "featurize.datasets",
        "probe.store.index",
        "featurize.datasets._parse",
    }


def test_unknown_name_suggests_closest(tmp_path):
    with pytest.raises(UnknownDatasetError, match="unknown dataset 'vco'; did you mean 'voc'"):
        load_dataset("vco", tmp_path)
    with pytest.raises(ValueError, match="did you mean 'nus'"):
        load_dataset("nuswid", tmp_path)
    with pytest.raises(ValueError, match="known: voc, coco, nus, cub, folder, cole"):
        load_dataset("imagenet", tmp_path)


def test_missing_module_is_a_clear_import_error():
    entry = DatasetEntry("x", "featurize.datasets.not_there:load", "test")
    with pytest.raises(ImportError, match=r"dataset 'x' needs the module featurize\.datasets"):
        entry.loader()


def test_aliases_options_and_root_checks(tmp_path):
    expected = make_voc(tmp_path / "voc", n_train=5, n_val=4)
    assert_index_matches(load_dataset("PASCAL", expected["root"]), expected)
    with pytest.raises(ValueError, match=r"does not take option.*colour.*accepts: check_images"):
        load_dataset("voc", expected["root"], colour=True)
    with pytest.raises(FileNotFoundError, match="dataset root for 'voc' not found"):
        load_dataset("voc", tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"dataset 'cole' needs the option.*: dataset"):
        load_dataset("cole", tmp_path)


# --------------------------------------------------------------------------------------------
# VOC 2012
# --------------------------------------------------------------------------------------------


def _write_voc(main: Path, split: str, values: dict[str, dict[str, int]], ids: list[str]):
    """Class files listing ``ids`` in this order; ``values[id][class]`` (default -1)."""
    main.mkdir(parents=True, exist_ok=True)
    for name in VOC_CLASSES:
        lines = [f"{i} {values.get(i, {}).get(name, -1):2d}" for i in ids]
        (main / f"{name}_{split}.txt").write_text("\n".join(lines) + "\n")


def _tiny_voc(root: Path) -> Path:
    main = root / "VOCdevkit" / "VOC2012" / "ImageSets" / "Main"
    train = {
        "2009_000003": {"cat": 1, "dog": 0},  # dog is "difficult": a negative
        "2008_000010": {"person": 0},  # only difficult: no positive, dropped
        "2008_000002": {"aeroplane": 1, "person": 1},
    }
    _write_voc(main, "train", train, list(train))
    val = {"2010_000005": {}, "2010_000001": {"bus": 1, "tvmonitor": 1}}
    _write_voc(main, "val", val, list(val))
    return main


def test_voc_hand_derived(tmp_path):
    _tiny_voc(tmp_path)
    index = load_dataset("voc", tmp_path, check_images=False)
    assert index.name == "voc" and index.class_names == VOC_CLASSES and len(VOC_CLASSES) == 20
    assert index.pool.image_ids == ("2008_000002", "2009_000003")
    pool = np.zeros((2, 20), np.uint8)
    pool[0, [0, 14]] = 1  # aeroplane, person
    pool[1, 7] = 1  # cat
    np.testing.assert_array_equal(index.pool.labels, pool)
    assert index.test.image_ids == ("2010_000001",)
    np.testing.assert_array_equal(np.flatnonzero(index.test.labels[0]), [5, 19])
    voc = tmp_path / "VOCdevkit" / "VOC2012"
    assert index.pool.paths[0] == voc / "JPEGImages" / "2008_000002.jpg"
    assert index.pool.n_unlabeled == index.test.n_unlabeled == 0


def test_voc_builder_roots_and_images(tmp_path):
    expected = make_voc(tmp_path)
    for root in (tmp_path, tmp_path / "VOCdevkit", tmp_path / "VOCdevkit" / "VOC2012"):
        assert_index_matches(load_dataset("voc", root), expected)
    assert len(expected["images"]) > len(expected["pool"]["paths"]) + len(expected["test"]["paths"])
    assert Image.open(expected["grayscale"]).mode == "L"
    assert Image.open(expected["cmyk"]).mode == "CMYK"
    assert expected["grayscale"] in expected["pool"]["paths"]
    sizes = {Image.open(p).size for p in expected["images"]}
    assert len(sizes) > 5


def test_voc_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no VOC 2012 layout.*VOCdevkit/VOC2012/Image"):
        load_dataset("voc", tmp_path)
    main = _tiny_voc(tmp_path)
    voc = main.parent.parent

    sofa = main / "sofa_val.txt"
    text = sofa.read_text()
    sofa.unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(f"expected the file {sofa}")):
        load_dataset("voc", tmp_path, check_images=False)
    sofa.write_text(text + "2010_000009 -1\n")
    with _raises(DatasetFormatError, sofa, None, "lists 3 images but", "aeroplane_val.txt"):
        load_dataset("voc", tmp_path, check_images=False)
    sofa.write_text(text.replace("2010_000001", "2010_000002"))
    with _raises(DatasetFormatError, sofa, 2, "2010_000002 is not listed in"):
        load_dataset("voc", tmp_path, check_images=False)
    sofa.write_text(text.replace(" 1\n", " 2\n").replace("-1\n", " 2\n", 1))
    with _raises(DatasetFormatError, sofa, 1, "label '2'", "not one of -1, 0, 1"):
        load_dataset("voc", tmp_path, check_images=False)
    sofa.write_text(text + "2010_000001 -1\n")
    with _raises(DatasetFormatError, sofa, 3, "2010_000001 is listed again (first on line 2)"):
        load_dataset("voc", tmp_path, check_images=False)
    sofa.write_text("2010_000005 -1 x\n2010_000001 -1\n")
    with _raises(DatasetFormatError, sofa, 1, "expected '<image_id> <-1|0|1>'", "3 field"):
        load_dataset("voc", tmp_path, check_images=False)
    sofa.write_text(text)

    missing = voc / "JPEGImages" / "2010_000001.jpg"
    train_file = main / "aeroplane_train.txt"
    with _raises(
        FileNotFoundError, "", None, "3 of 3 image files are missing", f"{train_file}:3"
    ):
        load_dataset("voc", tmp_path)
    _images(voc / "JPEGImages", "2008_000002.jpg", "2009_000003.jpg")
    with _raises(FileNotFoundError, missing, None, f"{main / 'aeroplane_val.txt'}:2"):
        load_dataset("voc", tmp_path)


# --------------------------------------------------------------------------------------------
# COCO 2014
# --------------------------------------------------------------------------------------------


def _coco_json(path: Path, categories, annotations, images=()) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    anns = [{"id": k, "image_id": i, "category_id": c} for k, (i, c) in enumerate(annotations)]
    data = {
        "images": [{"id": i} for i in images],
        "annotations": anns,
        "categories": [{"id": i, "name": n} for i, n in categories],
    }
    path.write_text(json.dumps(data))


def _tiny_coco(root: Path) -> None:
    cats = [(5, "bus"), (1, "person")]  # class index = list order, not id or name order
    anns = [(10, 1), (9, 5), (100, 5), (100, 1), (10, 1)]
    _coco_json(root / "annotations" / "instances_train2014.json", cats, anns, [9, 10, 25, 100])
    _coco_json(root / "annotations" / "instances_val2014.json", cats, [(7, 5)], [7, 8])


def test_coco_hand_derived(tmp_path):
    _tiny_coco(tmp_path)
    index = load_dataset("coco", tmp_path, check_images=False)
    assert index.class_names == ("bus", "person")
    assert index.pool.image_ids == ("10", "100", "9")  # string order; 25 has no annotation
    np.testing.assert_array_equal(index.pool.labels, [[0, 1], [1, 1], [1, 0]])
    assert index.pool.paths[2] == tmp_path / "train2014" / "COCO_train2014_000000000009.jpg"
    assert index.test.image_ids == ("7",)
    assert index.test.paths[0] == tmp_path / "val2014" / "COCO_val2014_000000000007.jpg"


def test_coco_builder(tmp_path):
    expected = make_coco(tmp_path)
    ids = expected["pool"]["image_ids"]
    assert list(ids) != sorted(ids, key=int)  # the fixture separates string from numeric order
    assert_index_matches(load_dataset("coco", tmp_path), expected)
    assert Image.open(expected["cmyk"]).mode == "CMYK"


def test_coco_errors(tmp_path):
    train = tmp_path / "annotations" / "instances_train2014.json"
    with pytest.raises(FileNotFoundError, match=re.escape(f"expected the file {train}")):
        load_dataset("coco", tmp_path, check_images=False)
    _tiny_coco(tmp_path)
    val = tmp_path / "annotations" / "instances_val2014.json"
    _coco_json(val, [(1, "person"), (5, "bus")], [(7, 5)])
    with _raises(DatasetFormatError, val, None, "'categories'", "differ from those of"):
        load_dataset("coco", tmp_path, check_images=False)
    _coco_json(val, [(5, "bus"), (1, "person")], [(7, 5), (8, 3)])
    with _raises(DatasetFormatError, val, None, "annotations[1] (image 8) has category_id 3"):
        load_dataset("coco", tmp_path, check_images=False)
    val.write_text('{"categories": [], "annotations": [')
    with _raises(DatasetFormatError, val, None, "not valid JSON"):
        load_dataset("coco", tmp_path, check_images=False)
    cats = [{"id": 5, "name": "bus"}, {"id": 1, "name": "person"}]
    val.write_text(json.dumps({"categories": cats, "annotations": [{"category_id": 5}]}))
    with _raises(DatasetFormatError, val, None, "annotations[0] needs integer 'image_id'"):
        load_dataset("coco", tmp_path, check_images=False)
    _tiny_coco(tmp_path)
    with _raises(FileNotFoundError, "", None, "4 of 4 image files are missing", str(train)):
        load_dataset("coco", tmp_path)


# --------------------------------------------------------------------------------------------
# NUS-WIDE
# --------------------------------------------------------------------------------------------


def test_nus_entry_normalization():
    assert normalize_nus_entry("actor\\0001_2124494179.jpg") == "actor/0001_2124494179.jpg"
    full = "C:\\ImageData\\Flickr\\actor\\0001_2124494179.jpg"
    assert normalize_nus_entry(full) == "actor/0001_2124494179.jpg"
    assert normalize_nus_entry("  D:\\x\\0002_7.jpg \r") == "x/0002_7.jpg"
    assert normalize_nus_entry("zebra/0003_9.jpg") == "zebra/0003_9.jpg"


def _tiny_nus(root: Path) -> None:
    (root / "ConceptsList").mkdir(parents=True)
    (root / "ConceptsList" / "Concepts81.txt").write_text("sky\r\nwater\r\n\r\n")
    (root / "ImageList").mkdir()
    (root / "ImageList" / "TrainImagelist.txt").write_text(
        "C:\\ImageData\\Flickr\\sky\\0001_11.jpg\r\nwater\\0002_22.jpg\r\nsky\\0003_33.jpg\r\n"
    )
    (root / "ImageList" / "TestImagelist.txt").write_text("water\\0004_44.jpg\n")
    gt = root / "Groundtruth" / "TrainTestLabels"
    gt.mkdir(parents=True)
    (gt / "Labels_sky_Train.txt").write_text("1 \r\n0 \r\n0 \r\n")
    (gt / "Labels_water_Train.txt").write_text("1\n1\n0\n\n")
    (gt / "Labels_sky_Test.txt").write_text("0\n")
    (gt / "Labels_water_Test.txt").write_text("0\n")


def test_nus_hand_derived(tmp_path):
    _tiny_nus(tmp_path)
    index = load_dataset("nus", tmp_path, check_images=False)
    assert index.class_names == ("sky", "water")
    assert index.pool.image_ids == ("sky/0001_11.jpg", "water/0002_22.jpg", "sky/0003_33.jpg")
    np.testing.assert_array_equal(index.pool.labels, [[1, 1], [0, 1], [0, 0]])
    assert index.pool.n_unlabeled == 1 and index.test.n_unlabeled == 1
    assert index.pool.paths[0] == tmp_path / "Flickr" / "sky" / "0001_11.jpg"


def test_nus_builder_and_image_layouts(tmp_path):
    expected = make_nus(tmp_path)
    assert expected["pool"]["n_unlabeled"] > 0
    assert_index_matches(load_dataset("nus", tmp_path), expected)
    (tmp_path / "Flickr").rename(tmp_path / "images")  # layout 2: images/<concept>/<file>
    index = load_dataset("nus", tmp_path)
    assert index.pool.paths[0] == tmp_path / "images" / expected["pool"]["image_ids"][0]
    for p in (tmp_path / "images").glob("*/*.jpg"):  # layout 3: flat images/<file>
        p.rename(tmp_path / "images" / p.name)
    index = load_dataset("nus", tmp_path)
    assert index.test.paths[-1] == tmp_path / "images" / Path(expected["test"]["paths"][-1]).name
    assert all(p.is_file() for p in index.pool.paths + index.test.paths)


def test_nus_errors(tmp_path):
    with _raises(FileNotFoundError, "", None, "concept list not found", "Concepts81.txt"):
        load_dataset("nus", tmp_path)
    _tiny_nus(tmp_path)
    gt = tmp_path / "Groundtruth" / "TrainTestLabels"
    train_list = tmp_path / "ImageList" / "TrainImagelist.txt"
    water = gt / "Labels_water_Train.txt"
    water.write_text("1\n1\n")
    with _raises(DatasetFormatError, water, None, "has 2 label lines but", str(train_list)):
        load_dataset("nus", tmp_path, check_images=False)
    water.write_text("1\n2\n0\n")
    with _raises(DatasetFormatError, water, 2, "expected a label 0 or 1, found '2'"):
        load_dataset("nus", tmp_path, check_images=False)
    water.write_text("1\n\n0\n1\n")
    with _raises(DatasetFormatError, water, 2, "found ''"):
        load_dataset("nus", tmp_path, check_images=False)
    water.unlink()
    with pytest.raises(
        FileNotFoundError, match=re.escape(f"'water' not found: expected the file {water}")
    ):
        load_dataset("nus", tmp_path, check_images=False)
    water.write_text("1\n1\n0\n")
    test_list = tmp_path / "ImageList" / "TestImagelist.txt"
    test_list.write_text("water\\0004_44.jpg\nwater/0004_44.jpg\n")
    with _raises(DatasetFormatError, test_list, 2, f"listed again (first in {test_list}:1)"):
        load_dataset("nus", tmp_path, check_images=False)
    test_list.unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(f"expected the file {test_list}")):
        load_dataset("nus", tmp_path, check_images=False)
    test_list.write_text("water\\0004_44.jpg\n")
    with _raises(FileNotFoundError, "", None, "4 of 4 image", f"{train_list}:1"):
        load_dataset("nus", tmp_path)


# --------------------------------------------------------------------------------------------
# CUB-200-2011
# --------------------------------------------------------------------------------------------


def _tiny_cub(root: Path) -> Path:
    ds = root / "CUB_200_2011"
    (ds / "attributes").mkdir(parents=True)
    (root / "attributes.txt").write_text("1 has_bill_shape::curved\n2 has_wing_color::blue\n")
    (ds / "images.txt").write_text("1 001.A/a_1.jpg\n2 001.A/a_2.jpg\n3 002.B/b_3.jpg\n")
    (ds / "train_test_split.txt").write_text("1 0\n2 1\n3 1\n")
    (ds / "attributes" / "image_attribute_labels.txt").write_text(
        "1 1 1 4 3.5\n1 2 0 1 2.25\n"
        "2 1 0 3 0 0 7.113\n2 2 1 2 0 9.2\n"  # two lines with extra fields, as officially
        "3 2 0 4 1.0\n3 1 0 2 1.5\n"  # image 3: no attribute present; lines out of order
    )
    return ds


def test_cub_hand_derived(tmp_path):
    ds = _tiny_cub(tmp_path)
    index = load_dataset("cub", tmp_path, check_images=False)
    assert index.class_names == ("has_bill_shape::curved", "has_wing_color::blue")
    assert index.pool.image_ids == ("001.A/a_2.jpg", "002.B/b_3.jpg")
    np.testing.assert_array_equal(index.pool.labels, [[0, 1], [0, 0]])
    assert index.pool.n_unlabeled == 1  # kept, as in Cole et al.'s format_cub.py
    assert index.test.image_ids == ("001.A/a_1.jpg",)
    np.testing.assert_array_equal(index.test.labels, [[1, 0]])
    assert index.test.paths[0] == ds / "images" / "001.A" / "a_1.jpg"


def test_cub_builder_and_roots(tmp_path):
    expected = make_cub(tmp_path / "data")
    for root in (tmp_path / "data", tmp_path / "data" / "CUB_200_2011"):
        assert_index_matches(load_dataset("cub", root), expected)
    cole = tmp_path / "cole" / "CUB_200_2011"  # Cole et al.'s data/cub layout
    cole.mkdir(parents=True)
    shutil.move(tmp_path / "data" / "CUB_200_2011", cole / "CUB_200_2011")
    shutil.move(tmp_path / "data" / "attributes.txt", cole / "attributes.txt")
    index = load_dataset("cub", tmp_path / "cole")
    np.testing.assert_array_equal(index.pool.labels, expected["pool"]["labels"])
    assert index.pool.paths[0] == cole / "CUB_200_2011" / "images" / index.pool.image_ids[0]


def test_cub_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no CUB-200-2011 layout"):
        load_dataset("cub", tmp_path)
    ds = _tiny_cub(tmp_path)
    labels = ds / "attributes" / "image_attribute_labels.txt"
    good = labels.read_text()

    def check(text: str, line: int | None, *fragments: str) -> None:
        labels.write_text(text)
        with _raises(DatasetFormatError, labels, line, *fragments):
            load_dataset("cub", tmp_path, check_images=False)

    check(good.replace("3 2 0 4", "3 2 2 4"), 5, "is_present 2 is not 0 or 1")
    check(good.replace("2 2 1 2 0 9.2", "2 2"), 4, "expected '<image_id> <attribute_id>")
    check("\n" + good.replace("3 1 0 2 1.5", "3 1 x 2 1.5"), 7, "'3 1 x 2 1.5'")
    check(good + "1 2 1 4 1.0\n", 7, "image 1, attribute 2 is given again")
    check(good.replace("3 1 0 2 1.5\n", ""), None, "no line for image 3, attribute 1")
    check(good.replace("3 1 0 2", "3 3 0 2"), 6, "attribute id 3 is outside 1..2")
    check(good.replace("3 1 0 2", "4 1 0 2"), 6, "image id 4 is not in")
    labels.write_text(good)

    split = ds / "train_test_split.txt"
    split.write_text("1 0\n2 1\n")
    with _raises(DatasetFormatError, split, None, "no line for image 3", f"{ds / 'images.txt'}:3"):
        load_dataset("cub", tmp_path, check_images=False)
    split.write_text("1 0\n2 1\n3 2\n")
    with _raises(DatasetFormatError, split, 3, "is_training_image '2' is not 0 or 1"):
        load_dataset("cub", tmp_path, check_images=False)
    split.write_text("1 0\n2 1\n3 1\n")
    (tmp_path / "attributes.txt").unlink()
    with _raises(FileNotFoundError, "", None, "attributes.txt", str(tmp_path / "attributes.txt")):
        load_dataset("cub", tmp_path, check_images=False)
    (ds / "attributes.txt").write_text("1 a\n3 b\n")
    with _raises(DatasetFormatError, ds / "attributes.txt", 2, "expected attribute id 2"):
        load_dataset("cub", tmp_path, check_images=False)
    (ds / "attributes.txt").write_text("1 a\n2 b\n")
    with _raises(FileNotFoundError, "", None, "3 of 3 image", f"{ds / 'images.txt'}:2"):
        load_dataset("cub", tmp_path)


# --------------------------------------------------------------------------------------------
# generic folder
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "with_split", "header"),
    [("csv", False, True), ("csv", True, False), ("jsonl", True, True), ("jsonl", False, True)],
)
def test_folder_builder(tmp_path, fmt, with_split, header):
    expected = make_folder(tmp_path, fmt=fmt, with_split=with_split, header=header)
    index = load_dataset("folder", tmp_path, **expected["options"])
    assert_index_matches(index, expected)
    assert index.name == tmp_path.name
    if not with_split:  # the documented seeded split: 20% of 20 rows
        assert len(index.test) == 4 and len(index.pool) == 16


def _images(root: Path, *names: str) -> None:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 6)).save(root / name)


def test_folder_hand_derived_csv(tmp_path):
    _images(tmp_path, "a.jpg", "b, c.jpg", "sub/d.jpg")
    (tmp_path / "classes.txt").write_text("dog\ncat\nbird\n")
    ann = tmp_path / "meta.csv"
    ann.write_text(
        "\ufefflabels,path,split,note\n"  # BOM, other column order, an ignored column
        "cat;dog,a.jpg,train,x\n"
        '" bird ;","b, c.jpg",TEST,y\n'
        "\n"
        "dog,sub/d.jpg,train,z\n"
    )
    index = load_dataset("folder", tmp_path, annotations=ann, classes=tmp_path / "classes.txt")
    assert index.class_names == ("dog", "cat", "bird")
    assert index.pool.image_ids == ("a.jpg", "sub/d.jpg")
    np.testing.assert_array_equal(index.pool.labels, [[1, 1, 0], [1, 0, 0]])
    assert index.test.image_ids == ("b, c.jpg",)
    np.testing.assert_array_equal(index.test.labels, [[0, 0, 1]])
    assert index.test.paths[0] == tmp_path / "b, c.jpg"


def test_folder_seeded_split_and_empty_policy(tmp_path):
    names = [f"{k}.jpg" for k in range(10)]
    _images(tmp_path, *names)
    rows = [f"{n},{'x' if k % 3 else ''}" for k, n in enumerate(names)]  # rows 0, 3, 6, 9 empty
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    with _raises(DatasetFormatError, tmp_path / "labels.csv", 1, "has no label",
                 "--option empty=keep"):
        load_dataset("folder", tmp_path)
    kept = load_dataset("folder", tmp_path, empty="keep", split_seed=7)
    perm = np.random.RandomState(7).permutation(10)
    assert kept.test.image_ids == tuple(names[i] for i in sorted(perm[-2:]))
    assert kept.pool.n_unlabeled + kept.test.n_unlabeled == 4
    dropped = load_dataset("folder", tmp_path, empty="drop", test_fraction=0.5)
    left = [n for k, n in enumerate(names) if k % 3]
    perm = np.random.RandomState(1200).permutation(6)
    assert dropped.pool.image_ids == tuple(left[i] for i in sorted(perm[:3]))
    assert dropped.class_names == ("x",) and dropped.pool.labels.all()


def test_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"annotation file not found.*labels\.csv"):
        load_dataset("folder", tmp_path)
    _images(tmp_path, "a.jpg", "b.jpg", "c.jpg")
    ann = tmp_path / "labels.csv"

    def check(text: str, line: int | None, *fragments: str, exc=DatasetFormatError, **kw):
        ann.write_text(text)
        with _raises(exc, ann, line, *fragments):
            load_dataset("folder", tmp_path, **kw)

    ann.write_text("path,labels,split\na.jpg,cat,test\nmissing.jpg,dog,train\n")
    with _raises(FileNotFoundError, tmp_path / "missing.jpg", None, f"listed in {ann}:3"):
        load_dataset("folder", tmp_path)
    check("a.jpg,cat\nb.jpg,dgo\n", 2, "unknown class 'dgo'", "did you mean 'dog'",
          classes=["cat", "dog"])  # fmt: skip
    check("a.jpg,cat\n./a.jpg,dog\n", 2, "image ./a.jpg is listed again (first on line 1)")
    check("a.jpg,cat,train\nb.jpg,cat,val\n", 2, "split 'val' is not one of train, test",
          "drawn from 'train'")  # fmt: skip
    check("a.jpg,cat,train\nb.jpg,cat\nc.jpg,cat,test\n", 2, "no split given")
    check("a.jpg,cat,train\nb.jpg,cat,train\n", None, "no row has split 'test'")
    check("a.jpg,cat,train,extra\n", 1, "expected 'path,labels' or 'path,labels,split'")
    check("path,labels\na.jpg\n", 2, "expected 2 cells as in the header, found 1")
    check("path,tags\na.jpg,cat\n", 1, "the header must name the columns 'path' and 'labels'")
    check("a.jpg,cat\n", None, "1 row is too few")
    ann.unlink()
    jl = tmp_path / "labels.jsonl"
    jl.write_text('{"path": "a.jpg", "labels": ["cat"]}\n{"path": "b.jpg", "labels": "cat"}\n')
    with _raises(DatasetFormatError, jl, 2, "labels a list of strings"):
        load_dataset("folder", tmp_path)
    jl.write_text('{"path": "a.jpg", "labels": ["cat"]}\n{"path": "b.jpg",\n')
    with _raises(DatasetFormatError, jl, 2, "not a JSON object"):
        load_dataset("folder", tmp_path)
    (tmp_path / "labels.txt").write_text("a.jpg,cat\n")
    with pytest.raises(ValueError, match="cannot tell the format"):
        load_dataset("folder", tmp_path, annotations=tmp_path / "labels.txt")
    jl.write_text('{"path": "a.jpg", "labels": ["cat"], "split": "train"}\n')
    (tmp_path / "classes.txt").write_text("cat\ndog\ncat\n")
    with _raises(DatasetFormatError, tmp_path / "classes.txt", 3, "'cat' is listed again"):
        load_dataset("folder", tmp_path, classes=str(tmp_path / "classes.txt"))
    with pytest.raises(ValueError, match="--option empty: expected error, keep or drop"):
        load_dataset("folder", tmp_path, empty="skip")
