"""MULAN's multi-label ARFF files (dense or sparse ``{index value, ...}`` rows) with the XML
file naming the label attributes: a small parser, so no extra dependency is needed
(scipy.io.arff refuses sparse rows)."""

from __future__ import annotations

import re
from pathlib import Path
from xml.etree import ElementTree

import numpy as np

from featurize.datasets import DatasetFormatError

__all__ = ["read_mulan"]

_ATTRIBUTE = re.compile(r"@attribute\s+('(?:[^']*)'|\"(?:[^\"]*)\"|\S+)\s+(.+)$", re.IGNORECASE)


def _label_names(xml_path: Path) -> list[str]:
    try:
        root = ElementTree.parse(xml_path).getroot()
    except (ElementTree.ParseError, OSError) as err:
        raise DatasetFormatError(f"--xml: cannot read {xml_path} as MULAN's label XML: {err}") \
            from None
    names = [el.get("name") for el in root.iter() if el.tag.split("}")[-1] == "label"]
    if not names or None in names:
        raise DatasetFormatError(f"--xml: {xml_path} names no <label name=...> elements; MULAN's "
                                 "XML lists each label attribute as <label name=\"...\"/>")
    return names


def _row_values(line: str, n_attributes: int, path: Path, number: int) -> list[str]:
    if line.startswith("{"):
        # sparse row: absent attributes are 0
        values = ["0"] * n_attributes
        body = line.strip().removeprefix("{").removesuffix("}").strip()
        for item in filter(None, (part.strip() for part in body.split(","))):
            index, _, value = item.partition(" ")
            values[int(index)] = value.strip()
        return values
    values = [part.strip() for part in line.split(",")]
    if len(values) != n_attributes:
        raise DatasetFormatError(f"{path} line {number}: {len(values)} values but the header "
                                 f"declares {n_attributes} attributes")
    return values


def read_mulan(arff_path: str | Path, xml_path: str | Path
               ) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Features ``(N, D)`` float32, labels ``(N, C)`` uint8 and the label names, from a MULAN
    ARFF file (numeric features; labels the attributes the XML names, valued 0/1)."""
    arff_path, xml_path = Path(arff_path), Path(xml_path)
    labels = _label_names(xml_path)
    attributes: list[str] = []
    rows: list[list[str]] = []
    in_data = False
    with open(arff_path, encoding="utf-8") as fh:
        for number, raw in enumerate(fh, start=1):
            line = raw.strip()
            if not line or line.startswith("%"):
                continue
            if in_data:
                rows.append(_row_values(line, len(attributes), arff_path, number))
            elif line.lower().startswith("@attribute"):
                match = _ATTRIBUTE.match(line)
                if match is None:
                    raise DatasetFormatError(f"{arff_path} line {number}: bad @attribute line")
                attributes.append(match.group(1).strip("'\""))
            elif line.lower().startswith("@data"):
                in_data = True
    missing = [name for name in labels if name not in attributes]
    if missing:
        raise DatasetFormatError(f"{arff_path}: the XML's labels {missing[:5]} are not attributes "
                                 "of the ARFF file; give the XML that belongs to it")
    if not rows:
        raise DatasetFormatError(f"{arff_path}: no @data rows")
    label_columns = [attributes.index(name) for name in labels]
    feature_columns = [i for i in range(len(attributes)) if i not in set(label_columns)]
    try:
        table = np.asarray(rows, dtype=np.float64)
    except ValueError:
        raise DatasetFormatError(f"{arff_path}: non-numeric values; MULAN imports need numeric "
                                 "features and 0/1 labels") from None
    y = table[:, label_columns]
    if not np.isin(y, (0.0, 1.0)).all():
        raise DatasetFormatError(f"{arff_path}: label attributes must be 0/1")
    return (table[:, feature_columns].astype(np.float32), y.astype(np.uint8), tuple(labels))
