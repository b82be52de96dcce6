"""A Slurm cluster of K nodes on this machine, to rehearse a cluster run before spending GPU hours on
one, and for the tests: ``SlurmCluster`` (``cluster.rehearsal``), what ``dlscale cluster up`` runs.

```python
from dlscale.cluster import SlurmCluster

with SlurmCluster(nodes=3, link_bandwidth="1gbit", node_link_bandwidth="2=100mbit") as c:
    subprocess.run(["dlscale", "sweep", "two-nodes.yaml", "--executor", "slurm"], env={**os.environ, **c.env()})
```

No torch at import time.
"""

from __future__ import annotations

from dlscale.cluster.options import ClusterOptions
from dlscale.cluster.rehearsal import SlurmCluster, cleanup_stale

__all__ = ["ClusterOptions", "SlurmCluster", "cleanup_stale"]
