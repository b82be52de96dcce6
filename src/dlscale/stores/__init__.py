"""Where the results store keeps its rows: an SQLite file (the embedded default) or a PostgreSQL
database shared by a team. ``dlscale.store.Store`` is the one API over both; the modules here hold
each backend's connection, transactions and schema, and nothing imports torch.
"""
