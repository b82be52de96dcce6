"""dlscale: measure, explain and predict deep-learning training performance."""

__version__ = "0.1.0"
