"""``spml compare``: a thin argparse layer over :func:`studies.results.compare.compare_heads`."""

from __future__ import annotations

import argparse

from probe.cli.args import add_device_argument
from probe.errors import SpmlError

COMPARE_EPILOG = """\
examples:
  spml probe yeast.zarr --loss an --save-head runs/an.pt
  spml probe yeast.zarr --loss gr --save-head runs/gr.pt
  spml compare runs/an.pt runs/gr.pt
  spml compare runs/gr.pt:0 runs/gr.pt:3 --label "gr paper" --label "gr tuned"
  spml compare spml-demo/heads/*.pt --json cmp.json --figure cmp.png
  spml compare spml-demo/gr-study spml-demo/heads/an.pt   # a study's winners vs a head
  spml compare studies --name yeast-gr                    # one of several studies in a folder

A study folder stands for its best 3 trials and the paper point, re-trained with their own
settings, seed and draw. Each head is scored on the test split of the store it was trained on
(or --store). A 1,000-resample paired bootstrap over the test images gives every mAP a 95%
interval and every pair a difference with its interval and a p-value, Holm-corrected over the
pairs. Heads from different stores or splits are refused (their test mAPs are not paired);
heads trained on different draws of one store (--observed-seed, a label budget or bias) are
compared on the same test images, with a note that the draws differ. Re-trained heads show a
progress line each.
"""


def _compare(args: argparse.Namespace) -> int:
    from studies.results.compare import compare_heads, format_comparison

    if args.resamples < 100:
        raise SpmlError(f"--resamples: at least 100 for a 95% interval; got {args.resamples}")
    if not 0.5 <= args.level < 1.0:
        raise SpmlError(f"--level: a coverage in [0.5, 1), e.g. 0.95; got {args.level}")
    cmp = compare_heads(args.heads, store=args.store, labels=args.label,
                        n_resamples=args.resamples, seed=args.seed, level=args.level,
                        device=args.device, name=args.name, progress=True)
    print(format_comparison(cmp))
    if args.json:
        from probe.engine.results import write_json_atomic

        write_json_atomic(args.json, cmp.to_dict())
        print(f"\nwritten to {args.json}")
    if args.figure:
        from studies.results.compare import plot

        print(f"figure: {plot(cmp, args.figure)}")
    return 0


def _bench_intervals(args: argparse.Namespace) -> int:
    import json

    from probe.bench.engine import bench_bootstrap

    report = bench_bootstrap(n=args.rows, c=args.classes, systems=args.systems,
                             n_resamples=args.resamples, repeats=args.repeats, device=args.device)
    m = report["machine_before"]
    print(f"bootstrap_map: {report['n_resamples']} resamples of {report['n']} x "
          f"{report['classes']}, {report['systems']} system(s) on {report['device']}: median "
          f"{report['median_seconds']:.2f} s of {len(report['seconds'])} "
          f"({', '.join(f'{s:.2f}' for s in report['seconds'])}); {m['cpu']}, {m['cpus']} "
          f"CPUs, {m['torch_threads']} threads, load {m['load_avg_1_5_15']} before, "
          f"{report['load_after']} after")
    print(json.dumps(report, indent=1))
    return 0


def register_cli(sub: argparse._SubParsersAction,
                 bench: argparse._SubParsersAction | None = None) -> None:
    p = sub.add_parser(
        "compare",
        help="test mAP of saved heads with 95%% intervals, and which differences are real",
        description="Compare trained heads on the same test images: mAP with a bootstrap "
        "interval per head, every pairwise difference with its paired interval and "
        "Holm-corrected p-value, as a table (and JSON / a figure).",
        epilog=COMPARE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("heads", nargs="+", metavar="HEADS",
                   help="head files from 'spml probe --save-head' (PATH: every trial in it; "
                   "PATH:T: trial T) or study folders ('spml study --out DIR', or DIR:NAME for "
                   "one of several studies in it: its best 3 trials and the paper point, "
                   "re-trained)")
    p.add_argument("--name", metavar="STUDY",
                   help="the study to take from each study folder whose storage holds several "
                   "(one folder: DIR:NAME does the same)")
    p.add_argument("--label", action="append",
                   help="a name per head, in order (repeatable; default: file, trial and loss)")
    p.add_argument("--store", help="the store to test on (default: the one the heads record)")
    p.add_argument("--resamples", type=int, default=1000,
                   help="bootstrap resamples of the test images (default: 1000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the resamples (default: 0)")
    p.add_argument("--level", type=float, default=0.95, help="interval coverage (default: 0.95)")
    p.add_argument("--json", metavar="PATH", help="also write the table as JSON")
    p.add_argument("--figure", metavar="PATH", help="also draw the intervals as a PNG")
    add_device_argument(p)
    p.set_defaults(func=_compare)
    if bench is None:
        return
    b = bench.add_parser(
        "intervals",
        help="seconds for the paired bootstrap of mAP (1,000 resamples of a COCO-sized test set)",
        description="Median seconds of probe.evaluation.intervals.bootstrap_map on random "
                    "scores, with the machine and its load; printed as a line, then as JSON.",
    )
    b.add_argument("--rows", type=int, default=40_137, help="test images (default: COCO's)")
    b.add_argument("--classes", type=int, default=80, help="classes (default: 80)")
    b.add_argument("--systems", type=int, default=1, help="systems scored (default: 1)")
    b.add_argument("--resamples", type=int, default=1000, help="default: 1000")
    b.add_argument("--repeats", type=int, default=3, help="runs, median reported (default: 3)")
    b.add_argument("--device", default="cpu", help="cpu (default) | cuda | cuda:N")
    b.set_defaults(func=_bench_intervals)
