"""Argument helpers shared by every ``spml`` command (written once, used by probe, featurize and
studies): value parsers that name the flag in their errors, and the options many commands take.

Pure argparse and the standard library: building the ``spml`` parser imports no torch.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import sys
import textwrap

from probe.errors import SpmlError, plain
from probe.store.protocol import PROTOCOL_SEED

__all__ = ["DEVICE_HELP", "Parser", "add_device_argument", "add_observed_seed_argument",
           "add_priors_argument", "add_seeds_argument", "add_trials_at_once_argument",
           "parse_assignments", "parse_floats", "parse_ints", "parse_names", "parse_seeds",
           "parse_sets", "parse_value", "print_report", "wrap"]

DEVICE_HELP = "auto (default: CUDA when available, else CPU) | cpu | cuda | cuda:N"


class Parser(argparse.ArgumentParser):
    """Every ``spml`` parser (sub-parsers too): an option is taken only as spelled, never by a
    prefix (``probe --batch`` is an error, not ``--batch-size``). A mistyped option or command
    is refused by the parser it was given to, with the nearest spelling it takes (``did you
    mean '--epochs'?``).
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _Subcommands)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(self.unrecognized(extras))
        return parsed

    def unrecognized(self, extras: list[str]) -> str:
        """The refusal of arguments this parser does not take, with a "did you mean" for each
        mistyped option (``--epoch`` → ``--epochs``)."""
        return "; ".join([f"unrecognized arguments: {' '.join(extras)}", *self._hints(extras)])

    def _hints(self, tokens: list[str]) -> list[str]:
        """A "did you mean" for each option in ``tokens`` this parser does not take."""
        taken = [o for a in self._actions if a.help != argparse.SUPPRESS  # hidden aliases: out
                 for o in a.option_strings]
        unknown = [t.split("=", 1)[0] for t in tokens
                   if t.startswith("--") and len(t) > 2 and t.split("=", 1)[0] not in taken]
        hints = []
        for name in unknown:
            near = difflib.get_close_matches(name, taken, n=1, cutoff=0.6)
            which = f" for '{name}'" if len(unknown) > 1 else ""
            hints.append(f"did you mean '{near[0]}'{which}?" if near else
                         f"'{name}' is no option of {self.prog} ('{self.prog} --help' lists "
                         "them)")
        return hints

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):  # type: ignore[override]
        """argparse's refusal (this parser's usage, exit 2); a missing required argument also
        names a mistyped option given with it (``--nam`` for ``--name``)."""
        if message.startswith("the following arguments are required"):
            message = "; ".join([message, *self._hints(getattr(self, "_given", []))])
        super().error(message)

    def _check_value(self, action, value):  # a mistyped command or choice: the nearest named
        if action.choices is not None and value not in action.choices \
                and all(isinstance(c, str) for c in action.choices):
            near = difflib.get_close_matches(str(value), list(action.choices), n=1, cutoff=0.6)
            hint = f"; did you mean '{near[0]}'?" if near else ""
            raise argparse.ArgumentError(
                action, f"invalid choice: '{value}' (choose from "
                f"{', '.join(map(str, action.choices))}){hint}")
        super()._check_value(action, value)


class _Subcommands(argparse._SubParsersAction):
    """Sub-commands whose arguments are checked by the sub-command's own parser: an unknown
    option is refused with that parser's usage and suggestion, not the top-level usage."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        super().__call__(parser, namespace, values, option_string)
        if not getattr(namespace, "command_prog", None):  # the innermost command's name
            namespace.command_prog = self._name_parser_map[values[0]].prog
        extras = vars(namespace).pop(argparse._UNRECOGNIZED_ARGS_ATTR, None)
        if extras:
            chosen = self._name_parser_map[values[0]]
            if isinstance(chosen, Parser):
                chosen.error(chosen.unrecognized(extras))
            vars(namespace)[argparse._UNRECOGNIZED_ARGS_ATTR] = extras


def wrap(*paragraphs: str) -> str:
    """Description text for RawDescriptionHelpFormatter (which keeps the epilog's line breaks)."""
    return "\n\n".join(textwrap.fill(p, width=88) for p in paragraphs)


def parse_value(text: str) -> object:
    """A command-line value: true/false → bool, none/null → None, then int, float, else str."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for conv in (int, float):
        with contextlib.suppress(ValueError):
            return conv(text)
    return text.strip()


def parse_sets(items: list[str] | None, option: str = "--set") -> dict[str, list[object]]:
    """``["w_T=2,5", "use_k=false"]`` → ``{"w_T": [2, 5], "use_k": [False]}``."""
    out: dict[str, list[object]] = {}
    for item in items or []:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key or not values.strip():
            raise SpmlError(f"{option} expects KEY=VALUE or KEY=V1,V2,...; got {plain(item)}")
        if key in out:
            raise SpmlError(f"{option} {key} given twice; put all its values in one comma list")
        out[key] = [parse_value(v) for v in values.split(",")]
    return out


def parse_assignments(items: list[str] | None, option: str = "--set") -> dict[str, object]:
    """``["alpha=0.2", "use_v=false"]`` → one value per name (no comma lists)."""
    out: dict[str, object] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise SpmlError(
                f"{option} expects NAME=VALUE (e.g. {option} alpha=0.2); got {plain(item)}")
        out[name.strip()] = parse_value(value)
    return out


def parse_ints(text: str | None, flag: str) -> list[int] | None:
    """``"0,1,2"`` → ``[0, 1, 2]``; None stays None; errors name ``flag``."""
    return _parse_list(text, flag, int, "integers", "0,1,2")


def parse_floats(text: str | None, flag: str) -> list[float] | None:
    """``"0.2,0.5"`` → ``[0.2, 0.5]``; None stays None; errors name ``flag``."""
    return _parse_list(text, flag, float, "numbers", "0.2,0.5,1")


def _parse_list(text: str | None, flag: str, conv: type, what: str, example: str) -> list | None:
    if text is None:
        return None
    try:
        values = [conv(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SpmlError(f"{flag} must be a comma list of {what}, e.g. {example}; got "
                        f"{plain(text)}") from None
    if not values:
        raise SpmlError(f"{flag} needs at least one {what[:-1]}; got {plain(text)}")
    return values


def parse_names(text: str, flag: str = "--loss") -> list[str]:
    """``"gr,an"`` → ``["gr", "an"]``."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise SpmlError(f"{flag} needs at least one name; got {plain(text)}")
    return names


def parse_seeds(text: str, flag: str = "--seeds") -> list[int]:
    """Single-positive draw seeds: integers in [0, 2**32), e.g. ``"1200,1,2"``."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise SpmlError(f"{flag} must be integers separated by commas, e.g. {PROTOCOL_SEED},1,2; "
                        f"got {plain(text)}") from None
    if not seeds or any(s < 0 or s >= 2**32 for s in seeds):
        raise SpmlError(f"{flag} needs integers in [0, 2**32); got {plain(text)}")
    return seeds


def add_device_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                        help: str = DEVICE_HELP) -> None:
    parser.add_argument("--device", default="auto", help=help)


def add_training_overrides(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--epochs``, ``--batch-size``, ``--lr``: overrides of the loss's paper training setting
    (None = the setting :func:`probe.engine.config.resolve_training` picks)."""
    parser.add_argument("--epochs", type=int, help="epochs (default: the loss's paper setting)")
    parser.add_argument("--batch-size", type=int, help="batch size (default: as --epochs)")
    parser.add_argument("--lr", type=float, help="learning rate (default: as --epochs)")


def add_observed_seed_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                               what: str = "to train on") -> None:
    parser.add_argument(
        "--observed-seed", type=int, default=PROTOCOL_SEED, metavar="SEED",
        help=f"the store's single-positive draw {what} (default: {PROTOCOL_SEED}, the "
        "literature's; others via 'spml draw')")


def add_priors_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--priors NAME``: the store prior a loss with ``Loss.prior`` reads (docs/priors.md)."""
    parser.add_argument(
        "--priors", metavar="NAME",
        help="the store's prior (per-image class scores, e.g. CLIP's) for a loss that uses one "
        "(vlpl, gpr); 'spml import priors' adds one, 'spml info' lists them")


def add_seeds_argument(parser: argparse.ArgumentParser) -> None:
    """``--seeds``: the single-positive draws a new store gets."""
    parser.add_argument(
        "--seeds", default=str(PROTOCOL_SEED), metavar="S1,S2,...",
        help=f"single-positive draws to store, comma list (default: {PROTOCOL_SEED}, the "
        "literature's; docs/protocol.md step 2 re-run with each seed gives other draws for "
        "multi-seed confirmation)")


def add_trials_at_once_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                                default: int, what: str = "trials asked at once and trained "
                                "stacked as one model") -> None:
    """``--trials-at-once N`` (dest ``batch``): a study's trials trained together, not the rows
    of a training step (``--batch-size``)."""
    parser.add_argument("--trials-at-once", dest="batch", type=int, default=default,
                        metavar="N", help=f"{what} (default {default}); not --batch-size, the "
                        "rows of one training step")


def print_report(text: str, report: dict, json_path: str | None = None) -> None:
    """What a bench prints: its text, then the report as JSON; with ``--json`` the report is
    also written there (atomically)."""
    import json

    print(text)
    print(json.dumps(report, indent=1))
    if json_path:
        from probe.engine.results import write_json_atomic

        write_json_atomic(json_path, report)
