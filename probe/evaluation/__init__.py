"""Scoring trained heads: the metrics of many stacked heads on a split (heads), intervals
and paired comparisons over test images (intervals), how a trial is scored for model
selection (selection), and whether it converged (convergence).
"""
