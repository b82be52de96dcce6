"""Where expectations come from, one module per source (the order they are tried in is
``accept/expectations.py``'s): healthy figures (``healthy.py``), the datasheet (``datasheet.py``), the
data-parallel reference (``dataparallel.py``), a device's own history (``identity.py``, ``history.py``,
``drift.py``)."""
