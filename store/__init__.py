"""LMDB persistence (snapshots, tree index, outbox): built by the persistence issue.

Nothing is exported yet; the runtime keeps its state in memory until then.
"""

__all__: list[str] = []
