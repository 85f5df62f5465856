"""Conversation trees: a session's messages in branches, their storage and their renderings.

``Conversations`` hands out a ``Conversation`` (append, fork, checkout,
context, merge, delete, export) for a session id (a Main's), and a
``SessionBranch`` is a spawned session's context: one branch of its root
Main's conversation. Both run on a
``ConversationBackend``: ``MemoryBackend`` here, the node's LMDB store wired
in by ``sessiontree.supervision``. Imports only ``sessiontree.protocol``.
"""

from sessiontree.conversations._backend import ConversationBackend, TimeSource
from sessiontree.conversations._conversation import Conversation, Conversations
from sessiontree.conversations._export import EXPORT_FORMATS
from sessiontree.conversations._html import render_html
from sessiontree.conversations._memory import MemoryBackend
from sessiontree.conversations._session_branch import (
    SessionBranch,
    session_branch,
    session_branch_id,
)
from sessiontree.conversations._text import nested_json, preview_text, text_tree
from sessiontree.conversations._values import draft as draft_message

__all__ = [
    "EXPORT_FORMATS",
    "Conversation",
    "ConversationBackend",
    "Conversations",
    "MemoryBackend",
    "SessionBranch",
    "TimeSource",
    "draft_message",
    "nested_json",
    "preview_text",
    "render_html",
    "session_branch",
    "session_branch_id",
    "text_tree",
]
