"""Did a trial converge? A best epoch that is the last one evaluated says it may not have.

When the best val-mAP epoch (docs/protocol.md step 5) is the last one evaluated, val mAP was
still rising: comparisons between losses then measure speed of learning as much as the losses.
:func:`best_is_last` tells it from a val-mAP curve; :data:`ADVICE` is what the commands suggest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["ADVICE", "best_is_last", "count_best_is_last"]

ADVICE = ("val mAP was still rising at the last epoch: train longer (--epochs) or with a larger "
          "learning rate (--lr), or let a study search them (spml study --epochs-choices, "
          "--search-lr)")


def best_is_last(val_curve: Sequence[float | None]) -> bool:
    """True when the best finite value of ``val_curve`` (one per evaluated epoch, in order;
    None where not evaluated) is at its last evaluated epoch, the first of equal values
    counting as the best (as selection does). Fewer than two evaluated epochs: False."""
    finite = [(i, float(v)) for i, v in enumerate(val_curve)
              if v is not None and math.isfinite(float(v))]
    return len(finite) >= 2 and max(finite, key=lambda p: (p[1], -p[0])) == finite[-1]


def count_best_is_last(curves: Sequence[Sequence[float | None]]) -> int:
    """How many of ``curves`` have their best value at their last evaluated epoch."""
    return sum(best_is_last(c) for c in curves)
