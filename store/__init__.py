"""LMDB persistence: session snapshots, the tree index, Mains by key, the
result outbox, inbound messages, shared memory and export/import.

One ``Store`` per node directory; every write goes through its one writer
thread with group commit. Records are msgspec msgpack with a schema version.
"""

from sessiontree.store._backup import Backup, backup_from_meta_page
from sessiontree.store._batch import WriteBatch
from sessiontree.store._env import (
    DATABASES,
    DEFAULT_MAP_SIZE,
    DEFAULT_MAX_READERS,
    LIVE_INDEXED,
)
from sessiontree.store._export import export_jsonl
from sessiontree.store._import import import_jsonl
from sessiontree.store._io import StoreIO
from sessiontree.store._keys import check_slot
from sessiontree.store._records import (
    SCHEMA_VERSION,
    BranchRecord,
    CallRecord,
    ContextEntry,
    ContextRecord,
    ConversationRecord,
    CycleRecord,
    InboxRecord,
    MemoryIdRecord,
    MemoryRecord,
    MessageRecord,
    MetaRecord,
    MovedRecord,
    OutboxRecord,
    QuarantineRecord,
    ReceivedRecord,
    RecordingRecord,
    SessionRecord,
    SlotRecord,
    StartsRecord,
    UsageRecord,
    WedgedRecord,
    decode_id,
    decode_record,
    encode_record,
)
from sessiontree.store._retention import prune
from sessiontree.store._slots import SlotExport, SlotHeader, read_slot_export
from sessiontree.store._store import Store
from sessiontree.store._verify import Verified, VerifyProblem, verify_store

__all__ = [
    "DATABASES",
    "DEFAULT_MAP_SIZE",
    "DEFAULT_MAX_READERS",
    "LIVE_INDEXED",
    "SCHEMA_VERSION",
    "Backup",
    "BranchRecord",
    "CallRecord",
    "ContextEntry",
    "ContextRecord",
    "ConversationRecord",
    "CycleRecord",
    "InboxRecord",
    "MemoryIdRecord",
    "MemoryRecord",
    "MessageRecord",
    "MetaRecord",
    "MovedRecord",
    "OutboxRecord",
    "QuarantineRecord",
    "ReceivedRecord",
    "RecordingRecord",
    "SessionRecord",
    "SlotExport",
    "SlotHeader",
    "SlotRecord",
    "StartsRecord",
    "Store",
    "StoreIO",
    "UsageRecord",
    "Verified",
    "VerifyProblem",
    "WedgedRecord",
    "WriteBatch",
    "backup_from_meta_page",
    "check_slot",
    "decode_id",
    "decode_record",
    "encode_record",
    "export_jsonl",
    "import_jsonl",
    "prune",
    "read_slot_export",
    "verify_store",
]
