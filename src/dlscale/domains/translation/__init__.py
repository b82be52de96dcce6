"""Translation: the Transformer models batched by target tokens (workload.py), the made grammar corpus and the
parallel-text layout's reader (data.py), and the long test to a BLEU target (task.py)."""
