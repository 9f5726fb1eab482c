"""Results as data: one tidy schema and the kept heads (rows), paired comparisons of heads
(compare), multi-seed confirmation (confirm) and exports (export).
"""
