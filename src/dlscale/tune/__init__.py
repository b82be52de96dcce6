"""``dlscale tune``: search the knobs of the short test for the fastest configuration that fits.

``search`` orders the knobs by expected gain and keeps a change only when its gain is clear of the
measured noise; ``trials`` runs each candidate as a real short test (its own process) and finds
finished ones in the store for ``--resume``; ``configfile`` reads and writes the YAML that
``dlscale train --config`` accepts. No torch at import time.
"""
