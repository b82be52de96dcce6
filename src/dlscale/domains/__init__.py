"""The domains dlscale trains, one folder per workload family, each holding everything of its domain:

- ``workload.py``: the model(s) and the synthetic batch the short test (``dlscale train``) times, and how
  much work a batch is; registered with ``dlscale.workloads`` (the interface and the registry);
- ``task.py``: the time-to-quality long test (``dlscale tta``): the model sized to the data, the batches,
  the loss, the evaluation and the quality metric; registered with ``dlscale.tta.tasks``;
- the domain's data: a made dataset (``dlscale dataset FAMILY DIR``) and the reader of the real
  dataset's layout (``data.py``, detection's ``coco.py``, the LLM's ``grammar.py``).

classification/ (images; its long test is tta/classifier.py, on an ImageNet-layout tree read by
dlscale.data.loader; digits.py makes a small one) · detection/ (images) · translation/ (target tokens) ·
recommendation/ (samples) · llm/ (tokens) · reinforcement/ (environment steps). The folder's name is its
family's (``workloads.base.FAMILIES``). Importing any of them imports no torch.
"""
