"""The dlscale command line: one module per command group, registered in ``app``."""
