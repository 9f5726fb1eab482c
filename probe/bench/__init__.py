"""``spml bench probe`` and ``spml bench store``: the engine against a plain PyTorch loop (engine),
the store's load speed (store), the synthetic prior of the bench store (prior).
"""
