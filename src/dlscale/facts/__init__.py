"""Facts dlscale ships as package data, each file with its sources, read through importlib.resources:

- ``gpus.yaml``: what each GPU model is and what its datasheet rates it at, the link technologies'
  rates, the measured GEMM fractions (read by ``dlscale.gpus``, the one reader);
- ``healthy.yaml``: what a healthy system of each GPU model gives in ``dlscale accept``'s checks
  (read by ``dlscale.accept.sources.healthy``; each model names its row of ``gpus.yaml``);
- ``deepbench/``: DeepBench's training shapes for ``micro gemm|conv|rnn`` (``dlscale.micro.shapes``);
- ``reference/``: the seed papers' published figures, imported as ``ref:`` records
  (``dlscale.importers.records``).

No code lives here; the training input pipeline is ``dlscale.data``.
"""
