"""Prediction of data-parallel scaling from a one-device run and link parameters (``dlscale predict``).

``links`` gives each link level (intra-node, inter-node) an alpha-beta model, fitted from a
``dlscale micro collectives`` record or taken from a datasheet table of what-if links. Reads
records only; never runs anything.
"""
