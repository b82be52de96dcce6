"""Reading figures from records (pure): what a figure is (``figure.py``), one reader per check
(``readers.py``), an acceptance's records in, its figures out (``collect.py``)."""
