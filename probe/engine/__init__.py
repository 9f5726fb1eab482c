"""The stacked trainer: settings (config), device-resident data, trials, the loop and its
steps (logits, optim), speed knobs and threads, results, and :func:`train_probe`.
"""
