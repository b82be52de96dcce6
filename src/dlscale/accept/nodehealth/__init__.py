"""A node's health: its inventory against the spec and its last sound acceptance (``inventory.py``), where
the kernel's Xid history is read from (``xid_history.py``), the burn-in's verdicts on silent corruption
(``burnin_verdicts.py``; its run is ``micro/burnin.py``), draining or resuming the Slurm node (``drain.py``)."""
