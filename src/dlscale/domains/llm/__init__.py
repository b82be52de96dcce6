"""LLM pretraining: the Llama-family models and their closed-form FLOP and memory counts (workload.py), the
made Markov-chain corpus (grammar.py), the C4 layout's reader (data.py), and the long test to a validation
log-perplexity target (task.py)."""
