"""``spml info``, ``spml verify`` and ``spml draw``: read, check and add draws to a feature
store; thin layers over :mod:`probe.store`, imported when a command runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from featurize.cli import add_command
from probe.cli.args import parse_seeds, wrap
from probe.errors import SpmlError

__all__ = ["format_summary", "register_cli"]


def _read_class_weights(path: str, class_names: list[str]) -> list[float]:
    """``--class-weights``: C numbers, one per line in the store's class order, or
    ``name weight`` lines naming every class once."""
    lines = [ln.split() for ln in Path(path).read_text(encoding="utf-8").splitlines()
             if ln.strip()]
    try:
        if lines and all(len(p) >= 2 for p in lines):
            named = {" ".join(p[:-1]): float(p[-1]) for p in lines}
            missing = [c for c in class_names if c not in named]
            if missing or len(named) != len(class_names):
                which = (f"missing {', '.join(missing[:5])}" if missing else
                         f"{len(named) - len(class_names)} unknown or repeated")
                raise SpmlError(f"--class-weights {path}: 'name weight' lines must name each of "
                                f"the store's {len(class_names)} classes once; {which}")
            return [named[c] for c in class_names]
        return [float(p[0]) for p in lines]
    except ValueError as err:
        raise SpmlError(f"--class-weights {path}: not a number ({err})") from None


def _cmd_draw(args: argparse.Namespace) -> int:
    from probe.errors import MissingPathError
    from probe.store import add_draws, open_store
    from probe.store.records import draw_record, draw_text

    seeds = parse_seeds(args.seeds)
    store = open_store(args.store)
    weights = None
    if args.class_weights is not None:  # without --bias semantic: add_draws refuses it
        if not Path(args.class_weights).is_file():
            raise MissingPathError(f"--class-weights: file {args.class_weights} not found")
        weights = _read_class_weights(args.class_weights, store.class_names)
    written = add_draws(args.store, seeds, k=args.k, fraction=args.fraction, bias=args.bias,
                        weights_by_class=weights)
    attrs = open_store(args.store).attrs
    for seed in seeds:
        print(f"{args.store}: draw {seed}: {draw_text(draw_record(attrs, seed))}"
              + (" (already there)" if seed not in written else "")
              + f"; train on it with --observed-seed {seed}")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from probe.store import open_store

    summary = open_store(args.store).summary()
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from probe.store import verify_store
    from probe.store.chunks import chunk_label, repair_hint

    report = verify_store(args.store)
    n_chunks = sum(a["chunks"] for a in report.arrays.values())
    for d in report.damaged:
        print(f"DAMAGED {d.array} chunk {chunk_label(d.chunk)}: {d.reason}")
    if report.unchecksummed:
        print(f"note: arrays {report.unchecksummed} carry no checksums (written before "
              "spml-probe stored them): a chunk damaged without changing its length cannot be "
              "detected there; re-create the store (featurize/import with --overwrite) to add them")
    if report.damaged:
        print(f"{report.path}: {len(report.damaged)} of {n_chunks} chunks damaged; "
              f"{repair_hint(report.path)}")
        return 1
    print(f"{report.path}: all {n_chunks} chunks of {len(report.arrays)} arrays read back as "
          "written")
    return 0


def _names(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", … ({len(names) - limit} more)" if len(names) > limit else "")


def _flat(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return {None: "none", True: "true", False: "false"}[value]
    if isinstance(value, list | tuple) and all(isinstance(v, int | float | str) for v in value):
        return ", ".join(map(str, value)) or "(none)"
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


def format_summary(summary: dict) -> str:
    """Human-readable ``spml info`` text for :meth:`probe.store.Store.summary`."""
    from probe.store.priors import prior_facts
    from probe.store.records import draw_text

    s = summary
    flip = "with flipped features" if s["has_flip"] else "no flipped features"
    lines = []
    if s["provenance"].get("weights_random"):
        lines += ["WARNING: RANDOM WEIGHTS — these features come from a randomly initialised "
                  f"backbone ({s['provenance'].get('weights')}); for tests and benchmarks only, "
                  "not results.", ""]
    if s["other_attrs"].get("n_bad_rows"):
        lines += [f"WARNING: {s['other_attrs']['n_bad_rows']} images could not be read "
                  "(--skip-bad); their features are zero (attribute bad_rows lists them).", ""]
    lines += [
        f"store       {s['path']} (schema {s['schema_version']}, completed {s['completed']})",
        f"dataset     {s['dataset']}: {s['rows']} rows, {s['classes']} classes, "
        f"{s['feature_dim']}-dim {s['dtype']} features, {flip}",
        f"classes     {_names(s['class_names'])}",
        f"positives   single-positive draws for seeds {s['observed_seeds']}",
        *(f"  draw {seed}: {draw_text(rec)}" for seed, rec in s.get("draws", {}).items()),
        f"unlabeled   rows with no positive: pool {s['n_unlabeled']['pool']}, "
        f"test {s['n_unlabeled']['test']}",
        f"disk        {s['disk_bytes'] / 2**20:.1f} MiB",
        "",
        f"{'split':<6} {'rows':>8} {'labels/row':>11} {'rows w/o pos':>13} {'classes w/o pos':>16}",
        *(f"{name:<6} {sp['rows']:>8} {sp['label_cardinality']:>11.3f} "
          f"{sp['rows_without_positive']:>13} {sp['classes_without_positive']:>16}"
          for name, sp in s["splits"].items()),
        *(f"  {name}: no positive for {_names(sp['classes_without_positive_names'])} "
          "(AP counts as 0 for them)" for name, sp in s["splits"].items()
          if sp["classes_without_positive"]),
    ]
    for name, rec in s.get("priors", {}).items():  # probe.store.priors
        prov = rec["provenance"]
        fields = prior_facts(prov)
        if rec["extras"]:
            fields.append(f"extras {', '.join(rec['extras'])}")
        source = f"; source {prov['source']}" if prov.get("source") else ""
        warning = f"; WARNING: {rec['warning']}" if rec.get("warning") else ""
        lines.append(f"prior       {name}: {', '.join(fields) or 'no provenance given'}{source}"
                     f"{warning}")
    if s["other_attrs"]:
        lines += ["", "attributes"]
        lines += [f"  {k}: {_flat(v)}" for k, v in s["other_attrs"].items()]
    lines += ["", "provenance"]
    lines += [f"  {k}: {_flat(v)}" for k, v in s["provenance"].items()]
    return "\n".join(lines)


def register_cli(sub: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    """Add ``spml info``, ``spml verify`` and ``spml draw``."""
    p = add_command(
        sub, "info",
        help="show what a feature store holds (sizes, splits, labels, provenance)",
        description=wrap(
            "Validate a feature store and print its dataset, shapes, per-split sizes, label "
            "cardinality, classes with no positive per split (their AP is 0), rows without a "
            "positive, single-positive seeds, disk size and provenance."),
        epilog="examples:\n  spml info stores/voc.zarr\n"
        "  spml info stores/voc.zarr --json | jq .splits")
    p.add_argument("store", metavar="STORE", help="feature store directory")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_cmd_info)

    p = add_command(
        sub, "verify",
        help="read every chunk of a feature store and report damaged ones",
        description=wrap(
            "Read every chunk of every array of a feature store (finished or not), check its "
            "length and CRC-32C checksum, and list the damaged chunks by array and index. Exit "
            "status 0: no damage; 1: damage found (re-run the featurize/import that wrote the "
            "store: it rewrites only the damaged blocks); 2: not a readable store."),
        epilog="examples:\n  spml verify stores/voc.zarr")
    p.add_argument("store", metavar="STORE", help="feature store directory")
    p.set_defaults(func=_cmd_verify)

    p = add_command(
        sub, "draw",
        help="add single-positive draws (other seeds of the protocol) or label-budget draws "
        "to a store",
        description=wrap(
            "Add observed/<seed> arrays to a complete store: docs/protocol.md step 2 re-run with "
            "other seeds, each phase re-seeded. The literature's draw is seed 1200; other draws "
            "let 'spml study confirm --observed-seeds' report mean ± std over draws. With --k "
            "and --fraction a draw keeps k positives per image on a fraction of the images "
            "(a label budget, the same seeded walk); every command that takes --observed-seed "
            "then trains on it, and 'spml info' lists it. Draws already in the store are kept "
            "as they are; a seed names one draw."),
        epilog="examples:\n  spml draw stores/coco.zarr --seeds 1,2,3\n"
        "  spml draw stores/coco.zarr --seeds 20 --k 2 --fraction 0.5   # then --observed-seed 20\n"
        "  spml draw stores/coco.zarr --seeds 21 --bias size            # label bias (COCO boxes)")
    p.add_argument("store", metavar="STORE", help="feature store directory")
    p.add_argument("--seeds", required=True, metavar="S1,S2,...", help="seeds to add")
    p.add_argument("--k", type=int, default=1,
                   help="observed positives per image (default 1: the protocol)")
    p.add_argument("--fraction", type=float, default=1.0,
                   help="fraction of the images labelled, in (0, 1] (default 1: the protocol)")
    p.add_argument("--bias", choices=("size", "location", "semantic"),
                   help="draw the single positive with a label bias (Cole et al.'s spml-bias): "
                   "in proportion to its objects' total area (size) or to the inverse distance "
                   "of their centres from the image centre (location) -- both need a store "
                   "featurized from COCO's instance annotations -- or to fixed per-class "
                   "weights (semantic, --class-weights); docs/priors.md")
    p.add_argument("--class-weights", metavar="FILE",
                   help="--bias semantic: one weight per class, one per line, in the store's "
                   "class order (or 'name weight' lines)")
    p.set_defaults(func=_cmd_draw)
