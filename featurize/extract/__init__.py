"""The featurize run: reading images (reading, images), the backbone forward and writing
blocks (writing), over one process or torchrun ranks (ranks); :mod:`~featurize.extract.run`
ties them together.
"""
