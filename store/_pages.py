"""LMDB's file read without mapping it: the meta pages, the length they promise,
and a walk of every B-tree page in use.

LMDB maps ``data.mdb`` and trusts it: a file shorter than its meta pages say
kills the process with SIGBUS on the first read past the end, and a page of
junk where a branch or leaf should be ends it on one of LMDB's assertions
(SIGABRT). So the store reads the file with ``pread`` first: ``read_meta``
and ``check_length`` before LMDB opens it, ``check_tree`` once a read
transaction pins a snapshot (so the pages it walks are not reused under
it). Each raises ``StoreDamagedError`` naming the file and what is wrong.

The layout (LMDB 0.9, 64-bit): a page starts with a 16-byte header
(``pgno`` u64, pad u16, ``flags`` u16, ``lower``/``upper`` u16, or the
overflow page count u32), then the node offsets (u16 each); pages 0 and 1
are the two meta pages, and the one with the larger transaction id is
current.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from sessiontree.protocol import StoreDamagedError

__all__ = [
    "MAX_MAP_SIZE",
    "RESTORE_HINT",
    "Meta",
    "check_length",
    "check_tree",
    "damaged",
    "offer_other",
    "out_of_bounds",
    "read_meta",
    "read_meta_pages",
]

MAGIC = 0xBEEFC0DE
DATA_VERSION = 1
P_INVALID = 2**64 - 1
#: The largest map a 64-bit process can hold: x86-64's 128 TiB of user space.
MAX_MAP_SIZE = 1 << 47
PAGE_HEADER = 16
P_BRANCH, P_LEAF, P_OVERFLOW, P_META = 0x01, 0x02, 0x04, 0x08
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04

_HEADER = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper
_META = struct.Struct("<IIQQ")  # magic, version, address, map size
_DB = struct.Struct("<IHHQQQQQ")  # pad (page size in the free db), flags, depth, 3 counts, root
_TAIL = struct.Struct("<QQ")  # last page, transaction id
_NODE = struct.Struct("<HHHH")  # lo, hi, flags, key size
_PGNO = struct.Struct("<Q")

#: What the operator can do about a damaged store (the end of every message).
RESTORE_HINT = (
    "stop the node, keep the damaged directory aside, and restore the store from a "
    "backup (`sessiontree store backup`) or an export (`sessiontree import`); see the "
    "README's 'Backups and restore'"
)


def damaged(path: str, problem: str, what: str) -> StoreDamagedError:
    """The ``StoreDamagedError`` for ``path``: what is wrong, then what to do."""
    return StoreDamagedError(
        f"store file {path} is damaged ({problem}): {what}; {RESTORE_HINT}",
        path=path,
        problem=problem,
    )


@dataclass(frozen=True)
class Meta:
    """The current meta page of a ``data.mdb``."""

    page_size: int
    map_size: int
    last_page: int
    txnid: int
    free_root: int
    free_depth: int
    main_root: int
    main_depth: int

    @property
    def length(self) -> int:
        """The bytes the file must have at least: every page up to ``last_page``."""
        return (self.last_page + 1) * self.page_size


def _parse_meta(raw: bytes, number: int) -> Meta | str:
    """Meta page ``number`` from its bytes, or why it is not one."""
    if len(raw) < PAGE_HEADER + _META.size + 2 * _DB.size + _TAIL.size:
        return "cut short"
    pgno, _, flags, _, _ = _HEADER.unpack_from(raw)
    magic, version, _, map_size = _META.unpack_from(raw, PAGE_HEADER)
    if not flags & P_META or pgno != number or magic != MAGIC:
        return "not an LMDB meta page"
    if version != DATA_VERSION:
        return f"LMDB data version {version}, this LMDB reads {DATA_VERSION}"
    free = _DB.unpack_from(raw, PAGE_HEADER + _META.size)
    main = _DB.unpack_from(raw, PAGE_HEADER + _META.size + _DB.size)
    last_page, txnid = _TAIL.unpack_from(raw, PAGE_HEADER + _META.size + 2 * _DB.size)
    page_size = free[0]
    if page_size < 512 or page_size & (page_size - 1):
        return f"page size {page_size}"
    if last_page < 1:
        return f"last page {last_page}"
    return Meta(page_size, map_size, last_page, txnid, free[7], free[2], main[7], main[2])


def read_meta(path: str) -> Meta:
    """The current meta page of ``path`` (the one with the larger transaction id).

    Raises ``StoreDamagedError``: ``bad_meta`` when either meta page is not
    one (LMDB refuses a file with one bad meta page too), or the current one
    holds figures no store can have (``out_of_bounds``); ``truncated`` when
    the file is too short to hold them. When the other meta page reads whole
    (its figures in bounds, inside the file, its tree walked), the message
    offers it: ``sessiontree store backup --meta-page N`` copies the store as
    of its transaction. ``OSError`` when the file cannot be read."""
    size, pages = read_meta_pages(path)
    for number, meta in enumerate(pages):
        if not isinstance(meta, Meta):
            what = f"meta page {number} is unreadable ({meta})"
            raise damaged(path, "bad_meta", what + offer_other(path, size, pages, number))
    first, second = pages
    assert isinstance(first, Meta)
    assert isinstance(second, Meta)
    if first.page_size != second.page_size:
        what = f"the meta pages disagree on the page size ({first.page_size}, {second.page_size})"
        raise damaged(path, "bad_meta", what)
    number = 0 if first.txnid >= second.txnid else 1
    current = pages[number]
    assert isinstance(current, Meta)
    why = out_of_bounds(current)
    if why is not None:
        what = f"meta page {number} (transaction {current.txnid}) {why}"
        raise damaged(path, "bad_meta", what + offer_other(path, size, pages, number))
    return current


def read_meta_pages(path: str) -> tuple[int, list[Meta | str]]:
    """The size of ``path`` and its two meta pages (each a ``Meta``, or why it is
    not one); ``StoreDamagedError`` (``truncated``) when the file is too short
    to hold them, ``OSError`` when it cannot be read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        first = _parse_meta(os.pread(fd, 4096, 0), 0)
        page_size = first.page_size if isinstance(first, Meta) else os.sysconf("SC_PAGE_SIZE")
        if size < 2 * page_size:
            raise damaged(
                path,
                "truncated",
                f"expected at least {2 * page_size} bytes (two meta pages), found {size}",
            )
        second = _parse_meta(os.pread(fd, 4096, page_size), 1)
    finally:
        os.close(fd)
    return size, [first, second]


def out_of_bounds(meta: Meta) -> str | None:
    """Why ``meta``'s figures can be no store's, or None: a map larger than a
    64-bit process can map, or a last page past the map (LMDB never writes a
    page outside its map, and grows the map before the data)."""
    if meta.map_size > MAX_MAP_SIZE:
        return f"says the map is {meta.map_size} bytes, more than a process maps ({MAX_MAP_SIZE})"
    if meta.length > meta.map_size:
        return (
            f"says its last page is {meta.last_page}, past its own map of {meta.map_size} "
            f"bytes ({meta.map_size // meta.page_size} pages of {meta.page_size})"
        )
    return None


def offer_other(path: str, size: int, pages: list[Meta | str], bad: int) -> str:
    """The sentence offering the meta page that is not ``bad``, when it reads
    whole (in bounds, inside the file of ``size`` bytes, its tree walked);
    else an empty string."""
    number = 1 - bad
    other = pages[number]
    if not isinstance(other, Meta) or out_of_bounds(other) is not None or other.length > size:
        return ""
    try:
        check_tree(path, other)
    except StoreDamagedError:
        return ""
    directory = os.path.dirname(path)
    return (
        f"; meta page {number} (transaction {other.txnid}) reads whole: `sessiontree store "
        f"backup --meta-page {number} --store {directory} DEST` copies the store as of it"
    )


def check_length(path: str, meta: Meta) -> None:
    """``StoreDamagedError`` (``truncated``) when ``path`` is shorter than ``meta``
    says: LMDB would read past its end and the process die of SIGBUS."""
    size = os.stat(path).st_size
    if size < meta.length:
        what = (
            f"expected {meta.length} bytes ({meta.last_page + 1} pages of {meta.page_size}, "
            f"as its meta page says), found {size}"
        )
        raise damaged(path, "truncated", what)


def check_tree(path: str, meta: Meta) -> int:
    """Walk every branch and leaf page of the free-page tree, the main tree and
    each named database in it (and the first page of every overflow run) as
    ``meta`` describes them; return the pages walked.

    Each page must carry its own number, the kind its parent promised, sane
    bounds and children inside the file. Call it while a read transaction
    pins ``meta``'s snapshot (or a newer one). Raises ``StoreDamagedError``
    (``bad_page``) naming the page and the database."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return _Walk(fd, path, meta).run()
    finally:
        os.close(fd)


class _Walk:
    def __init__(self, fd: int, path: str, meta: Meta) -> None:
        self.fd = fd
        self.path = path
        self.meta = meta
        self.pages = 0

    def bad(self, db: str, pgno: int, what: str) -> StoreDamagedError:
        return damaged(self.path, "bad_page", f"page {pgno} of database {db!r}: {what}")

    def run(self) -> int:
        meta = self.meta
        self.tree("(free pages)", meta.free_root, meta.free_depth, main=False)
        self.tree("(main)", meta.main_root, meta.main_depth, main=True)
        return self.pages

    def read(self, db: str, pgno: int, length: int) -> bytes:
        if not 2 <= pgno <= self.meta.last_page:
            raise self.bad(db, pgno, f"outside the file's pages 2..{self.meta.last_page}")
        raw = os.pread(self.fd, length, pgno * self.meta.page_size)
        if len(raw) < length:
            raise self.bad(db, pgno, "past the end of the file")
        return raw

    def tree(self, db: str, root: int, depth: int, *, main: bool) -> None:
        if root == P_INVALID:
            return  # an empty database
        if not 1 <= depth <= 64:
            raise self.bad(db, root, f"its tree claims a depth of {depth}")
        stack = [(root, 1)]
        psize = self.meta.page_size
        while stack:
            pgno, level = stack.pop()
            page = self.read(db, pgno, psize)
            self.pages += 1
            number, _, flags, lower, upper = _HEADER.unpack_from(page)
            if number != pgno:
                raise self.bad(db, pgno, f"its header says page {number}")
            kind = flags & (P_BRANCH | P_LEAF | P_OVERFLOW | P_META)
            want = P_LEAF if level == depth else P_BRANCH
            if kind != want:
                what = "leaf" if want == P_LEAF else "branch"
                raise self.bad(db, pgno, f"expected a {what} page, found flags {flags:#x}")
            if not PAGE_HEADER <= lower <= upper <= psize or lower & 1:
                raise self.bad(db, pgno, f"node bounds {lower}..{upper} do not fit the page")
            count = (lower - PAGE_HEADER) >> 1
            offsets = struct.unpack_from(f"<{count}H", page, PAGE_HEADER)
            if offsets and not upper <= min(offsets) <= max(offsets) <= psize - _NODE.size:
                where = f"{min(offsets)}..{max(offsets)}"
                raise self.bad(db, pgno, f"node offsets {where} are outside the page")
            if want == P_BRANCH:
                if not offsets:
                    raise self.bad(db, pgno, "a branch page without children")
                for offset in offsets:
                    lo, hi, top, _ = _NODE.unpack_from(page, offset)
                    stack.append((lo | hi << 16 | top << 32, level + 1))
            else:
                self.leaf(db, pgno, page, offsets, main=main)

    def leaf(
        self, db: str, pgno: int, page: bytes, offsets: tuple[int, ...], *, main: bool
    ) -> None:
        psize = self.meta.page_size
        # The node flags' low byte (offset 4) says whether the value lives elsewhere.
        for offset in [o for o in offsets if page[o + 4] & (F_BIGDATA | F_SUBDATA)]:
            _, _, flags, ksize = _NODE.unpack_from(page, offset)
            at = offset + _NODE.size + ksize
            if flags & F_SUBDATA:
                # a named database (in the main tree), or one key's values of a
                # DUPSORT database (F_DUPDATA too)
                if main == bool(flags & F_DUPDATA) or at + _DB.size > psize:
                    raise self.bad(db, pgno, f"a node at offset {offset} has flags {flags:#x}")
                name = db if not main else page[offset + _NODE.size : at].decode(errors="replace")
                sub = _DB.unpack_from(page, at)
                self.tree(name, sub[7], sub[2], main=False)
            else:
                if at + _PGNO.size > psize:
                    raise self.bad(db, pgno, f"a node at offset {offset} is outside the page")
                (first,) = _PGNO.unpack_from(page, at)
                self.overflow(db, first)

    def overflow(self, db: str, pgno: int) -> None:
        head = self.read(db, pgno, PAGE_HEADER)
        number, _, flags, _, _ = _HEADER.unpack_from(head)
        (pages,) = struct.unpack_from("<I", head, 12)
        if number != pgno or not flags & P_OVERFLOW:
            raise self.bad(db, pgno, f"expected an overflow page, found flags {flags:#x}")
        if pages < 1 or pgno + pages - 1 > self.meta.last_page:
            raise self.bad(db, pgno, f"an overflow run of {pages} pages past the file's end")
        self.pages += 1
