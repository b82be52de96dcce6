"""The registry of time-to-quality tasks, one per workload family beyond image classification.

``get(family)`` finds a task; ``for_model(name)`` the task of a model's family; ``domains()`` the
registered families. Importing this package imports no torch.
"""

from __future__ import annotations

import importlib

from dlscale.errors import UsageError
from dlscale.longtest.tasks.base import EpochContext, Task, TaskData, layout_error

__all__ = ["EpochContext", "Task", "TaskData", "layout_error", "register", "get", "for_model", "domains"]

# family -> module under dlscale.longtest.tasks that registers its task
BUILTIN = {
    "detection": "detection",
    "translation": "translation",
    "recommendation": "recommendation",
    "llm": "llm",
    "reinforcement": "rl",
}
_TASKS: dict[str, Task] = {}


def register(task: Task) -> Task:
    _TASKS[task.family] = task
    return task


def get(family: str) -> Task:
    """The task of ``family`` (its module imported on first use); a UsageError if there is none."""
    if family not in _TASKS and family in BUILTIN:
        importlib.import_module(f"dlscale.longtest.tasks.{BUILTIN[family]}")
    if family not in _TASKS:
        raise UsageError(f"no time-to-quality task for {family!r}; domains: classification, {', '.join(BUILTIN)}")
    return _TASKS[family]


def for_model(model: str) -> Task:
    from dlscale import workloads

    return get(workloads.get(model).family)


def domains() -> list[str]:
    return list(BUILTIN)
