"""The ``spml`` command: one entry point; every subcommand is defined in its package's ``cli``.

Where each command lives (a module per package, or per command group in :mod:`studies.cli`),
and the library it is a thin layer over:

=============================================  ===========================  =======================
command                                        defined in                   over the library
=============================================  ===========================  =======================
``spml featurize | backbones``                 :mod:`featurize.cli`         featurize
``spml import …``                              :mod:`featurize.cli.imports`  featurize.imports
``spml info | verify | draw``                  :mod:`featurize.cli.store`   probe.store
``spml priors``                                :mod:`featurize.cli.priors`  featurize.priors.clip
``spml bench featurize``                       :mod:`featurize.cli`         featurize.bench
``spml losses | probe``, ``spml bench probe``  :mod:`probe.cli`             probe
``spml study``, ``spml study confirm``         :mod:`studies.cli.study`     studies.study.run,
.confirm ``spml report``                                :mod:`studies.cli.report`    studies.report
``spml export``                                :mod:`studies.cli.export`    studies.results.export
``spml analyze …``                             :mod:`studies.cli.analyze`   studies.analyses
``spml compare``                               :mod:`studies.cli.compare`   studies.results.compare
``spml finetune``                              :mod:`studies.cli.finetune`  studies.finetune.run
``spml demo``                                  :mod:`studies.cli.demo`      studies.demo
``spml table``                                 :mod:`studies.cli.table`     studies.table
``spml plugins``                               :mod:`studies.cli.plugins`   probe.registry
=============================================  ===========================  =======================

Each module exposes ``register_cli(sub, bench)``; a command is a thin function
``func(args) -> int`` over library functions that return results. Argument helpers shared by
all of them are in :mod:`probe.cli.args`. Building the parser imports no torch, so ``--help``
is instant. User errors (:class:`probe.SpmlError`) and the environment's (``OSError``: a
missing path, a permission, a full disk) print as one line, ``spml <command>: error: …``, and
exit with status 2 (``SPML_DEBUG=1`` shows their traceback); anything else is a bug in
spml-probe and prints its traceback with a request to report it, exit status 1.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Callable

from probe import __version__
from probe.errors import SpmlError

# modules that add subcommands, in the order they appear in ``spml --help``
COMMAND_MODULES = (
    "featurize.cli", "featurize.cli.imports", "featurize.cli.store", "featurize.cli.priors",
    "probe.cli", "studies.cli.study", "studies.cli.report", "studies.cli.export",
    "studies.cli.analyze", "studies.cli.compare", "studies.cli.finetune", "studies.cli.demo",
    "studies.cli.table", "studies.cli.plugins",
)


def build_parser() -> argparse.ArgumentParser:
    from probe.cli.args import Parser

    parser = Parser(
        prog="spml",
        description=(
            "spml-probe: fast linear-probe experiments for single-positive multi-label learning. "
            "Featurize a dataset once with a frozen backbone (or import features), then train "
            "linear heads with any SPML loss and search their hyperparameters."
        ),
        epilog="Run 'spml COMMAND --help' for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"spml-probe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    bench_parser = sub.add_parser(
        "bench",
        help="measure speed (featurize images/s, probe seconds/epoch) against plain PyTorch",
        description="Speed measurements, printed as a table and as JSON.",
    )
    bench = bench_parser.add_subparsers(dest="bench_target", metavar="TARGET", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register_cli(sub, bench)
    return parser


def two_word_commands() -> dict[tuple[str, str], Callable[[], argparse.ArgumentParser]]:
    """Commands spelled as two words with their own parser (``spml study confirm``): the first
    word's parser cannot also take a sub-command, since it has a positional argument."""
    from studies.cli.study import confirm_parser

    return {("study", "confirm"): confirm_parser}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    make = two_word_commands().get(tuple(argv[:2]))  # type: ignore[arg-type]
    if make is not None:
        args = make().parse_args(argv[2:])
        args.command = " ".join(argv[:2])
    else:
        args = build_parser().parse_args(argv)
    args.argv = argv  # a command that starts worker processes repeats its own arguments
    prog = getattr(args, "command_prog", None) or f"spml {args.command}"  # spml import priors
    try:
        return int(args.func(args) or 0)
    except (SpmlError, OSError) as err:
        # a user's mistake (SpmlError) or the environment's (a path, a permission, the disk):
        # one line naming the cause (a closed pipe, as in `spml losses show gr | head`, is no error)
        if isinstance(err, BrokenPipeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        if os.environ.get("SPML_DEBUG"):
            raise
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception:
        # anything else is a bug in spml-probe, not the user's mistake: show the traceback
        traceback.print_exc()
        print(
            f"{prog}: internal error: this is a bug in spml-probe; please report it "
            f"with the command that raised it (spml {' '.join(argv)}), spml-probe {__version__}, "
            "and the traceback above",
            file=sys.stderr,
        )
        return 1
