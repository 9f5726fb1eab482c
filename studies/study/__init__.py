"""An Optuna study on the stacked engine: :func:`~studies.study.run.run_study` (run), its settings
and checks (settings), identity and sampler (create), storages (storage), the worker loop (worker),
pruning, crash safety (heartbeat), search spaces (space), its summary and verdict, and ``spml
bench study`` (bench).
"""
