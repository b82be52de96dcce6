"""Reinforcement learning: the PPO actor-critic and its loss (workload.py), and the long test to a mean-return
target on a gymnasium environment (task.py): no dataset, the environment is the data."""
