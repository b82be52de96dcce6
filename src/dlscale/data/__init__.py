"""The training input pipeline: a synthetic JPEG dataset maker (``synth``), the training loader
(``loader``), its feed to the device (``train_feed``) and the staged input bench (``bench``).

The package data dlscale ships (GPU facts, healthy figures, DeepBench shapes, the seed papers'
references) lives in ``dlscale.facts``.
"""
