"""``spml plugins``: every extension point's registry -- losses, backbone families, dataset
adapters, prior sources -- with where each entry comes from and the plugins that failed to load
(:mod:`probe.registry`; docs/plugins.md)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from probe.cli.args import wrap

__all__ = ["plugin_registries", "register_cli"]


def plugin_registries() -> list[Any]:
    """The four registries, in the order the flow meets them (each imports its built-ins)."""
    from featurize.datasets import DATASETS
    from featurize.priors import PRIOR_SOURCES
    from featurize.specs import FAMILIES
    from probe.losses import REGISTRY

    return [DATASETS, FAMILIES, PRIOR_SOURCES, REGISTRY]


def plugin_listing() -> list[dict[str, Any]]:
    """One record per registry: its kind, entry-point group, entries with their origin, and the
    plugins that failed to load (every installed plugin is imported)."""
    listing = []
    for registry in plugin_registries():
        entries = [{"name": name, "origin": registry.origin(name)}
                   for name in sorted(registry.names())]
        failures = [str(failure) for failure in registry.failures()]
        listing.append({"kind": registry.kind, "group": registry.group, "entries": entries,
                        "failures": failures})
    return listing


def _cmd_plugins(args: argparse.Namespace) -> int:
    listing = plugin_listing()
    if args.json:
        print(json.dumps(listing, indent=2))
        return 0
    for record in listing:
        print(f"{record['kind']} registry (entry-point group {record['group']}):")
        for entry in record["entries"]:
            print(f"  {entry['name']:<22} {entry['origin']}")
        for failure in record["failures"]:
            print(f"  FAILED: {failure}")
    return 0


def register_cli(sub: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    """Add ``spml plugins``."""
    p = sub.add_parser(
        "plugins", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="list the losses, backbone families, dataset adapters and prior sources, built-in "
        "and from installed plugins",
        description=wrap(
            "Every extension point of spml-probe is one registry: dataset adapters "
            "(spml_probe.datasets), backbone families (spml_probe.backbones), prior sources "
            "(spml_probe.priors) and losses (spml_probe.losses). An installed package adds to "
            "one by declaring an entry point in that group (docs/plugins.md). This lists each "
            "registry's entries and where they come from, and names every plugin that failed "
            "to load (the others stay available)."))
    p.add_argument("--json", action="store_true", help="print the listing as JSON")
    p.set_defaults(func=_cmd_plugins)
