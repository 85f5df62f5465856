"""The store's I/O layer: every write transaction goes through one ``StoreIO``.

It is thin on purpose, so tests can make the disk fail (``ENOSPC`` on a put,
``EIO`` on a commit) by passing a subclass to ``Store``. Only the writer
thread calls it.
"""

from __future__ import annotations

import lmdb

__all__ = ["StoreIO"]


class StoreIO:
    """Begin, write and commit LMDB write transactions (called on the writer thread).

    Any ``OSError`` or ``lmdb.Error`` raised here aborts the transaction; the
    writer reports it to every caller of that commit (nothing acknowledged).
    """

    def begin(self, env: lmdb.Environment) -> lmdb.Transaction:
        return env.begin(write=True)

    def put(self, txn: lmdb.Transaction, db: lmdb._Database, key: bytes, value: bytes) -> None:
        txn.put(key, value, db=db)

    def delete(self, txn: lmdb.Transaction, db: lmdb._Database, key: bytes) -> None:
        txn.delete(key, db=db)

    def commit(self, txn: lmdb.Transaction) -> None:
        txn.commit()  # with sync on, LMDB fsyncs before this returns
