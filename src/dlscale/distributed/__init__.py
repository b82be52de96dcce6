"""Data-parallel runs: rank detection, the torchrun launch, emulated nodes, the per-rank worker."""
