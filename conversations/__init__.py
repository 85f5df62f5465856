"""Conversation trees: a session's messages in branches, their storage and their renderings.

``Conversations`` hands out a ``Conversation`` (append, fork, checkout,
context, merge, delete, export) for a session id, on a
``ConversationBackend``: ``MemoryBackend`` here, the node's LMDB store wired
in by ``sessiontree.supervision``. Imports only ``sessiontree.protocol``.
"""

from sessiontree.conversations._backend import ConversationBackend, TimeSource
from sessiontree.conversations._conversation import Conversation, Conversations
from sessiontree.conversations._export import EXPORT_FORMATS
from sessiontree.conversations._html import render_html
from sessiontree.conversations._memory import MemoryBackend
from sessiontree.conversations._text import nested_json, preview_text, text_tree

__all__ = [
    "EXPORT_FORMATS",
    "Conversation",
    "ConversationBackend",
    "Conversations",
    "MemoryBackend",
    "TimeSource",
    "nested_json",
    "preview_text",
    "render_html",
    "text_tree",
]
