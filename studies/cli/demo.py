"""``spml demo``: a thin layer over :func:`studies.demo.run_demo`."""

from __future__ import annotations

import argparse
from pathlib import Path

from probe.cli.args import add_device_argument
from probe.errors import SpmlError


def _demo(args: argparse.Namespace) -> int:
    from studies.demo import DemoConfig, run_demo

    if args.study_trials < 1:  # refused before the demo's first step writes
        raise SpmlError(f"--study-trials must be a positive integer; got {args.study_trials}")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise SpmlError(f"--out {args.out}: is a file; expected a folder for the demo")
    run_demo(DemoConfig(out=args.out, images=args.images, device=args.device,
                        study_trials=args.study_trials))
    return 0


def register_cli(sub: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    d = sub.add_parser(
        "demo",
        help="the whole workflow offline in seconds: import yeast, probe, study, report",
        description=(
            "Imports the real multi-label yeast set (shipped inside the river package) into a "
            "feature store, trains AN, EM, GR and OPML heads on its single positives and prints "
            "their val/test mAP, runs a short GR study with pruning, and writes the study report. "
            "Offline; 10–25 s on 2 CPU cores (more on a busy machine). --images also featurizes "
            "2×2 grids of scikit-learn's handwritten digits with the offline pretrained "
            "EfficientNet-Lite0 and probes them (extra 'lite0' and scikit-learn)."
        ),
        epilog="example: spml demo --out spml-demo && open spml-demo/report/report.html",
    )
    d.add_argument("--out", default="spml-demo", help="output folder (default spml-demo)")
    d.add_argument("--images", action="store_true",
                   help="also run featurize → probe on real digit images (slower)")
    d.add_argument("--study-trials", type=int, default=24, help="GR study trials (default 24)")
    add_device_argument(d)
    d.set_defaults(func=_demo)
