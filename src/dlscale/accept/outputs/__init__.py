"""What an acceptance hands over: the verdict document, JUnit XML, records and the sha256 manifest
(``artifacts.py``), the HTML report (``report.py``), a lab's own healthy-figures file (``healthy_export.py``)."""
