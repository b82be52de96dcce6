"""Image classification: the seed papers' model zoo and tinycnn (workload.py, tinycnn.py), and a small real
dataset made from scikit-learn's digits (digits.py); its long test is tta/classifier.py, to a top-1 target."""
