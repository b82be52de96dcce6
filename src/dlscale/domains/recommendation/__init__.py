"""Recommendation: NCF and DLRM (workload.py), the made implicit-feedback ratings and the MovieLens layout's
reader (data.py), and the long test to an HR@10 target, NDCG@10 beside it (task.py)."""
