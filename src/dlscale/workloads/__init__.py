"""Workloads (models) behind one interface, found by name through the registry; each domain's own
workloads live in its folder under dlscale/domains/ (workload.py) and register here."""

from dlscale.workloads.base import Workload, all_workloads, get, names, register

__all__ = ["Workload", "all_workloads", "get", "names", "register"]
