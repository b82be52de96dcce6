"""Workloads (models) behind one interface, found by name through the registry."""

from dlscale.workloads.base import Workload, all_workloads, get, names, register

__all__ = ["Workload", "all_workloads", "get", "names", "register"]
