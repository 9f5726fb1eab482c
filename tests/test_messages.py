"""Every line a researcher reads: a table of bad inputs across the ``spml`` commands, each
refused with exit status 2 by a message that names the flag the user typed (or the culprit:
the file, line and column, the repeated id, the directory), with values in plain form and no
Python or numpy repr; a mistyped option gets "did you mean" with its own command's usage.
Also the lines that read right: plural counts, the per-epoch line, a loss's repr, the
``spml info`` prior line."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from studies.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

#: what no message may contain: Python/numpy reprs and config class names
FORBIDDEN = ("np.", "tensor(", "None", "[]", "=True", "=False", "ProbeConfig", "StudySettings",
             "SpeedOptions", "FinetuneConfig", "BenchConfig", "ReportOptions", "FeaturizeConfig",
             "ClipPriorConfig", "Traceback", "Errno")


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    """``spml argv`` in-process: (exit status, the error message, all of stderr)."""
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's refusals
        code = exit_.code
    err = capsys.readouterr().err
    found = [ln for ln in err.splitlines() if re.match(r"spml[\w ]*: error: ", ln)]
    return code, found[-1].split(": error: ", 1)[1] if found else "", err


@pytest.fixture(scope="module")
def env(tmp_path_factory, yeast_store) -> dict[str, str]:
    """A copy of the yeast store holding prior 'p', score tables with one fault each, a saved
    head, an image folder with an unlabeled row, a plain file and an empty folder."""
    root = tmp_path_factory.mktemp("messages")
    store = root / "y.zarr"
    shutil.copytree(yeast_store, store)
    from probe.store import open_store

    s = open_store(store)
    ids, classes = list(s.image_ids), list(s.class_names)
    values = np.random.default_rng(0).random((len(ids), len(classes))).round(3)

    def table(name: str, header: list[str], rows: list[list]) -> None:
        lines = [",".join(header), *(",".join(map(str, r)) for r in rows)]
        (root / name).write_text("\n".join(lines) + "\n")

    def rows() -> list[list]:
        return [[i, *v] for i, v in zip(ids, values)]

    table("ok.csv", ["image_id", *classes], rows())
    r = rows()
    r[4][3] = ""  # line 6, column 4 (Class3)
    table("empty.csv", ["image_id", *classes], r)
    r = rows()
    r[5][0] = ids[2]
    table("dup.csv", ["image_id", *classes], r)
    table("miss.csv", ["image_id", *classes[:-1]], [x[:-1] for x in rows()])
    for word in ("nan", "inf"):
        r = rows()
        r[7][2] = word
        table(f"{word}.csv", ["image_id", *classes], r)
    imgs = root / "imgs"
    imgs.mkdir()
    from PIL import Image

    for k in range(6):
        pixels = np.random.default_rng(k).integers(0, 255, (20, 20, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(imgs / f"{k}.jpg")
    (imgs / "labels.csv").write_text("0.jpg,cat\n1.jpg,\n2.jpg,dog\n3.jpg,cat\n4.jpg,dog\n"
                                     "5.jpg,cat\n")
    (root / "afile.txt").write_text("not a folder\n")
    import torch

    torch.save({"bogus.weight": torch.zeros(2)}, root / "wrong.pt")  # fits no backbone
    (root / "emptydir").mkdir()
    assert main(["import", "priors", str(store), "--name", "p", "--from",
                 str(root / "ok.csv")]) == 0
    assert main(["probe", str(store), "--loss", "an", "--epochs", "1", "--quiet",
                 "--save-head", str(root / "h.pt")]) == 0
    return {"S": str(store), "D": str(root)}


# (argv with {S} the store and {D} the fixture folder, what the message must name)
CASES: list[tuple[str, tuple[str, ...]]] = [
    # spml probe
    ("probe {S} --loss an --epochs 0", ("--epochs", "got 0")),
    ("probe {S} --loss an --batch-size 0", ("--batch-size", "got 0")),
    ("probe {S} --loss an --lr nan", ("--lr", "got nan")),
    ("probe {S} --loss an --lr inf", ("--lr", "got inf")),
    ("probe {S} --loss an --weight-decay -1", ("--weight-decay",)),
    ("probe {S} --loss an --optimizer sgd --momentum 2", ("--momentum",)),
    ("probe {S} --loss an --eval-every -1", ("--eval-every",)),
    ("probe {S} --loss an --intervals -1", ("--intervals",)),
    ("probe {S} --loss an --step-threads 0", ("--step-threads",)),
    ("probe {S} --loss an --trial-block -1", ("--trial-block",)),
    ("probe {S} --loss an --trials-seeds 1,x", ("--trials-seeds",)),
    ("probe {S} --loss gpr", ("--priors NAME",)),
    ("probe {S} --loss an --priors p", ("--priors p", "drop --priors")),
    ("probe {S} --loss gr --set w_T=abc", ("'w_T'", "got abc")),
    ("probe {S} --loss gr --set w_t=2", ("did you mean 'w_T'",)),
    ("probe {S} --loss an --set use_k", ("--set", "KEY=VALUE")),
    ("probe {S} --loss nope", ("unknown loss 'nope'",)),
    ("probe {S} --loss an --observed-seed 7", ("seed 7", "spml draw")),
    ("probe {S} --loss an --eval-head {D}/missing.pt", ("--eval-head",)),
    ("probe {S} --loss an --eval-head {D}/h.pt --head-trial 5", ("trial 5 asked for", "1 head ")),
    ("probe {S} --loss an --device cuda:7", ("--device",)),
    ("probe {S} --loss an --device tpu", ("--device",)),
    ("probe {D}/missing.zarr --loss an", ("missing.zarr",)),
    ("probe {S} --loss an --epoch 3", ("did you mean '--epochs'",)),
    ("probe {S} --loss an --batch 4", ("did you mean '--batch-size'",)),
    # spml study
    ("study {S} --loss an --trials-at-once 0 --out {D}/s", ("--trials-at-once", "got 0")),
    ("study {S} --loss an --trials 0 --out {D}/s", ("--trials ", "got 0")),
    ("study {S} --loss an --workers 0 --out {D}/s", ("--workers",)),
    ("study {S} --loss an --epochs 0 --out {D}/s", ("--epochs",)),
    ("study {S} --loss an --lr nan --out {D}/s", ("--lr", "got nan")),
    ("study {S} --loss an --sampler nope --out {D}/s", ("--sampler", "got nope")),
    ("study {S} --loss an --epochs-choices 1,x --out {D}/s", ("--epochs-choices",)),
    ("study {S} --loss gr --set w_T=2,4 --out {D}/s", ("--set", "got 2,4", "--grid")),
    ("study {S} --loss an --priors p --out {D}/s", ("--priors p",)),
    ("study {S} --loss gpr --priors teachr --out {D}/s", ("teachr", "it holds p")),
    ("study {S} --loss an --triasl 3 --out {D}/s", ("did you mean '--trials'",)),
    ("study confirm --storage {D}/nope/study.log --store {S}", ("--storage",)),
    ("study confirm --storage {D}/afile.txt --store {S}", ("--storage", "suffix .txt")),
    ("study confirm --storage {D}/s.log --store {S} --top 3", ("did you mean '--top-k'",)),
    # report, export, compare, analyze, finetune
    ("report {D}/emptydir --out {D}/afile.txt", ("--out", "is a file")),
    ("report {D}/nope", ("nope",)),
    ("report {D}/emptydir --dip 100", ("did you mean '--dpi'",)),
    ("export {D}/nope --out {D}/t.csv", ("nope",)),
    ("export {D}/emptydir --out {D}/t.xyz", ("--out", ".csv or .parquet")),
    ("compare {D}/nope", ("nope",)),
    ("compare {D}/h.pt --stroe {S}", ("did you mean '--store'",)),
    ("analyze ablation {S} --out {D}/a --epochs 0", ("--epochs",)),
    ("analyze ablation {S} --out {D}/a --epoch 1", ("did you mean '--epochs'",)),
    ("finetune voc --root {D}/nope --out {D}/ft --los an", ("did you mean '--loss'",)),
    ("finetune voc --root {D}/nope --out {D}/ft --loss an --epochs 0", ("--epochs", "got 0")),
    ("finetune voc --root {D}/nope --out {D}/ft --loss an --lr nan", ("--lr", "got nan")),
    ("finetune voc --root {D}/nope --out {D}/ft --loss an --workers -1", ("--workers",)),
    ("analyze curves --loss gr --set w_T=x --out {D}/a", ("--set", "'w_T'", "got x")),
    ("compare {D}/h.pt {D}/h.pt --store {S} --resamples 0", ("--resamples",)),
    ("compare {D}/h.pt:5 --store {S}", ("h.pt holds 1 head", "trial 5")),
    ("report {D}/emptydir --top 0", ("--top", "got 0")),
    ("draw {S} --seeds 5 --bias size --class-weights {D}/nope.csv", ("--class-weights",)),
    ("probe {S} --loss gr --set use_k=maybe", ("'use_k'", "true or false", "got maybe")),
    ("probe {S} --loss gr --set q1=-5", ("'q1'", "got -5")),
    ("probe {S} --loss gr --set w_T=2 --set w_T=3", ("--set w_T given twice",)),
    ("study {S} --loss gr --grid w_T=1,2 --out {D}/s", ("--grid", "--sampler grid")),
    # store commands
    ("info {D}/missing.zarr", ("missing.zarr",)),
    ("info {D}/ok.csv", ("ok.csv", "not a Zarr feature store")),
    ("verify {D}/missing.zarr", ("missing.zarr",)),
    ("draw {S} --seeds x", ("--seeds",)),
    ("draw {S} --seeds -1", ("--seeds",)),
    ("draw {S} --seds 5", ("did you mean '--seeds'",)),
    ("draw {S} --seeds 5 --bias sise", ("--bias", "did you mean 'size'")),
    # spml import priors: the culprit named
    ("import priors {S} --name q --from {D}/empty.csv", ("line 6, column 4", "Class3",
                                                         "empty cell")),
    ("import priors {S} --name q --from {D}/dup.csv", ("image_id", "row2")),
    ("import priors {S} --name q --from {D}/miss.csv", ("missing Class14",)),
    ("import priors {S} --name q --from {D}/nan.csv", ("value nan",)),
    ("import priors {S} --name q --from {D}/inf.csv", ("value inf",)),
    ("import priors {S} --name q --from {S}", ("is a directory",)),
    ("import priors {S} --name p --from {D}/ok.csv", ("--overwrite",)),
    ("import priors {S} --name q --from {D}/ok.csv --tiles 4x", ("--tiles", "got 4x")),
    ("import priors {S} --name q --from {D}/ok.csv --overwrit", ("did you mean '--overwrite'",)),
    ("import arrays --features {S} --labels {D}/l.npy --name t --out {D}/t.zarr",
     ("--features", "is a directory")),
    ("import yeast --out {S}", ("--overwrite",)),
    # featurize (random weights: no download; the dataset is read before any write)
    ("featurize folder --root {D}/imgs --out {D}/f.zarr --backbone resnet18 --weights random",
     ("labels.csv:2", "--option empty=keep")),
    ("featurize folder --root {D}/imgs --out {D}/f.zarr --backbone resnet18 --weights random "
     "--option empty=maybe", ("--option empty", "got maybe")),
    ("featurize folder --root {D}/imgs --out {D}/f.zarr --backbone resnet18 --weights random "
     "--option annotations={D}/imgs", ("is a directory",)),
    ("featurize folder --root {D}/imgs --out {D}/f.zarr --backbone resnet18 --weights random "
     "--option empty=keep --batch-size 0", ("--batch-size",)),
    ("featurize folder --root {D}/afile.txt --out {D}/f.zarr --backbone resnet18 --weights "
     "random", ("--root", "is a file")),
    ("featurize folder --root {D}/imgs --out {D}/f.zarr --option bad", ("--option",)),
    ("featurize folder --root {D}/imgs --out {D}/f.zarr --backbone resnet18 --weights "
     "{D}/wrong.pt --option empty=keep", ("does not fit", "102 missing keys", "1 unexpected key")),
    ("featurize folder --root {D}/imgs --out {D}/f.zarr --backbon resnet18",
     ("did you mean '--backbone'",)),
    # losses, bench, the command itself
    ("losses show nope", ("unknown loss 'nope'",)),
    ("losses shwo gr", ("did you mean 'show'",)),
    ("bench probe --rows 0", ("--rows",)),
    ("bench probe --trials 0", ("--trials",)),
    ("bench probe --rowz 100", ("did you mean '--rows'",)),
    ("bench store --in-process", ("'--in-process' is no option of spml bench store",)),
    ("stduy {S}", ("did you mean 'study'",)),
    ("demo --study-trials 0 --out {D}/demo", ("--study-trials", "got 0")),
    ("demo --out {D}/afile.txt", ("--out", "is a file")),
    ("backbones --zz", ("'--zz' is no option of spml backbones",)),
    ("plugins --jsn", ("unrecognized arguments: --jsn", "did you mean '--json'")),
    ("priors {S} --name c --model nope", ("--model", "open_clip:")),
    ("priors {S} --name c --modle open_clip:ViT-B-32/openai", ("did you mean '--model'",)),
    ("table {S} --losses nope", ("--losses", "'nope'")),
    ("table {S} --losses an --observed-seeds 99", ("--observed-seeds", "not 99")),
    ("table {S} --include fulll", ("--include", "fulll")),
    ("table {S} --losses an --tune 4", ("--tune needs --out",)),
    ("table {S} --losses an --priors teach", ("--priors", "'teach'")),
    ("table {S} --losess an", ("did you mean '--losses'",)),
]


def test_the_table_covers_every_command_and_is_large():
    from studies.cli import build_parser

    commands = {argv.split()[0] for argv, _ in CASES}
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    missing = set(sub.choices) - commands
    assert len(CASES) >= 40 and not missing, missing


@pytest.mark.parametrize(("argv", "names"), CASES, ids=[c[0][:60] for c in CASES])
def test_a_bad_input_is_refused_in_the_users_words(env, capsys, argv, names):
    code, message, err = _run(argv.format(**env).split(), capsys)
    assert code == 2, err
    assert message, err
    for name in names:
        assert name.format(**env) in message, message
    for bad in FORBIDDEN:
        assert bad not in message, (bad, message)


def test_an_error_is_headed_by_the_command_typed(env, capsys):
    for argv, prog in ((["import", "priors", env["S"], "--name", "p", "--from",
                         env["D"] + "/ok.csv"], "spml import priors"),
                       (["bench", "probe", "--rows", "0"], "spml bench probe"),
                       (["probe", env["S"], "--epochs", "0"], "spml probe")):
        code, _, err = _run(argv, capsys)
        assert code == 2 and err.startswith(f"{prog}: error: "), err


def test_a_mistyped_option_gets_its_own_commands_usage(env, capsys):
    for argv, prog in ((["probe", env["S"], "--epoch", "3"], "spml probe"),
                       (["import", "priors", env["S"], "--nam", "x"], "spml import priors"),
                       (["study", "confirm", "--storage", "x", "--store", "y", "--top", "3"],
                        "spml study confirm"),
                       (["bench", "probe", "--rowz", "3"], "spml bench probe")):
        code, message, err = _run(argv, capsys)
        assert code == 2 and err.startswith(f"usage: {prog} "), err
        assert "did you mean '--" in message and err.splitlines()[-1].startswith(prog), err


def test_the_per_epoch_line_shows_this_epochs_value_and_the_best_so_far(env, capsys,
                                                                        monkeypatch):
    monkeypatch.setenv("SPML_PROGRESS", "lines")
    out = Path(env["D"]) / "run.json"
    assert main(["probe", env["S"], "--loss", "an", "--lr", "0.5", "--epochs", "5",
                 "--json", str(out)]) == 0
    err = capsys.readouterr().err
    out.unlink()
    lines = [ln for ln in err.splitlines() if re.match(r"epoch \d+/5: ", ln)]
    assert len(lines) == 5
    assert "probe an ×1: starting (5 epochs)" in err and "(1 head)" in err
    best, best_epoch = -1.0, 0
    for epoch, line in enumerate(lines, 1):
        m = re.fullmatch(rf"epoch {epoch}/5: val mAP ([\d.]+); best so far val mAP ([\d.]+) "
                         r"\(epoch (\d+)\)", line)
        assert m, line
        now, so_far, at = float(m[1]), float(m[2]), int(m[3])
        if now > best:
            best, best_epoch = now, epoch
        assert (so_far, at) == (best, best_epoch), line
    assert len({ln.split(";")[0].split(": ")[1] for ln in lines}) > 1  # the values do change


def test_a_loss_repr_shows_its_hyperparameters_and_preset():
    from probe.losses import create_loss

    gr = create_loss("gr", preset="coco")
    text = repr(gr)
    assert text.startswith("GR(") and text.endswith("preset='coco')")
    for spec in gr.hparam_specs:
        assert f"{spec.name}={gr.hparam(spec.name)!r}" in text
    assert repr(create_loss("gr", w_T=3.0)) .count("w_T=3.0") == 1
    assert "preset" not in repr(create_loss("an"))


def test_info_prints_only_the_prior_fields_that_are_set(env, capsys, tmp_path):
    scores = tmp_path / "s.npy"
    from probe.store import open_store

    s = open_store(env["S"])
    np.save(scores, np.random.default_rng(1).random((s.n_rows, s.n_classes)))
    store = tmp_path / "y.zarr"
    shutil.copytree(env["S"], store)
    assert main(["import", "priors", str(store), "--name", "t", "--from", str(scores),
                 "--tiles", "4x4"]) == 0
    capsys.readouterr()
    assert main(["info", str(store)]) == 0
    out = capsys.readouterr().out
    lines = {ln.split(":")[0].split()[-1]: ln for ln in out.splitlines()
             if ln.startswith("prior ")}
    assert re.fullmatch(r"prior +p: no provenance given; source .*ok\.csv", lines["p"])
    assert re.fullmatch(r"prior +t: tiles 4x4; source .*s\.npy", lines["t"])
    assert not any(bad in out for bad in ("None", "[]", "True", "False"))
    assert json.loads(json.dumps(s.attrs.get("priors", {})))  # the record itself is unchanged
