"""Facts dlscale ships as package data, each file with its sources, read through importlib.resources:

- ``healthy.yaml``: what a healthy system of each GPU model gives in ``dlscale accept``'s checks
  (read by ``dlscale.accept.refs``);
- ``deepbench/``: DeepBench's training shapes for ``micro gemm|conv|rnn`` (``dlscale.micro.shapes``);
- ``reference/``: the seed papers' published figures, imported as ``ref:`` records
  (``dlscale.importers.records``).

No code lives here; the training input pipeline is ``dlscale.data``.
"""
