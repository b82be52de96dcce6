"""Training workloads run by the harness: the throughput short test."""
