"""``sessiontree.testing``: a local stand-in for an OpenAI-compatible chat
model, over real sockets, for an application's tests and for trying
sessiontree offline (``sessiontree standin`` runs one from the shell).

``StandinServer`` is a real HTTP/1.1 server on 127.0.0.1 that speaks the
chat-completions API (``POST /v1/chat/completions``, ``GET /v1/models``), so
the official ``openai`` SDK talks to it exactly as it talks to a provider. The
offline demo runs its model calls on it, and tests use it to count what
reached "the provider" and to inject the faults a real one has.

It runs an asyncio server on one thread of its own (so a thousand concurrent
streams cost no threads); ``start()`` returns once it listens and ``close()``
stops it, drops every open connection and joins that thread. Every public
method is thread-safe and may be called from any thread, including from a
coroutine on another event loop (none of them blocks except the ``wait_*``
methods, which take a bounded timeout).

**Replies are deterministic.** A reply is the next one queued with
:meth:`StandinServer.script`, or, with the queue empty, ``"echo "`` followed
by the text of the last user message. Tokens are counted as
whitespace-separated words (:func:`count_tokens`):

- ``prompt_tokens`` = for every message, 1 (its role) + the words of its text
  content + the words of its tool calls' names and arguments
  (:func:`prompt_tokens`); ``tools`` and other request fields are not counted;
- ``completion_tokens`` = the words of the reply's text + the words of each
  tool call's name and arguments (:func:`completion_tokens`).

``max_tokens`` (or ``max_completion_tokens``) is honoured: the text is cut to
that many words, tool calls that no longer fit are dropped, and the finish
reason is ``"length"``. Tool calls are sent only when the request has
``tools``; otherwise only the scripted text goes out.

**Streaming** (``"stream": true``) sends server-sent events in the
chat-completions chunk format: a first chunk with the role, one chunk per
word of text (``words_per_chunk``), tool-call deltas (the call's id and name
first, then its arguments in pieces), a chunk with the finish reason, then,
when ``stream_options.include_usage`` is true, a chunk with empty
``choices`` and the ``usage`` (every earlier chunk then carries
``"usage": null``), and finally ``data: [DONE]``. The body uses chunked
transfer encoding, as OpenAI's does.

**Faults** (:class:`Fault`, kinds in :class:`FaultKind`) are queued with
:meth:`StandinServer.fail_next` and taken one per chat-completions request in
arrival order, or chosen per request with the ``x-standin-fault`` header
(e.g. ``extra_headers={"x-standin-fault": "slow;delay=0.5"}``), which wins
over the queue and leaves it untouched.

**What it counts** (all readable while it runs): requests received at the
chat-completions endpoint, whatever became of them (a body over the cap is
not counted); completions served (a reply written to its end, counted just
before its last bytes go out, so a client never holds a reply the count
lacks); tokens served, summed from the ``usage`` it
reported (a reply that reported none adds nothing); client disconnects seen
before a reply was finished; and the JSON bodies of the last
``max_recorded`` requests. ``wait_for_requests``, ``wait_for_completions``
and ``wait_for_disconnects`` block until a count is reached, with a timeout.

Only 127.0.0.1 is served. Bodies over ``max_body_bytes`` get 413; invalid
JSON and bad fields get 400 with an OpenAI-style error body
(``{"error": {"message", "type", "param", "code"}}``); other paths 404.

It needs the standard library alone (it imports nothing of sessiontree, so
any test suite can use it). The package, one concern a module:

- ``_script``: token counting, ``ToolCall``, ``Reply``, ``FaultKind``,
  ``Fault``, ``StandinStats`` (plain data, any thread)
- ``_http``: reading a request, the tracked connection, response heads,
  chunked bodies, OpenAI-style errors
- ``_chat``: ``ChatHandler``, the chat-completions endpoint (validation,
  faults, replies whole or streamed, counting a reply served)
- ``_ledger``: ``Ledger``, the queues, recorded bodies and counters under one
  lock, shared by the server and its handler
- ``_server``: ``StandinServer``, its lifecycle, thread, connection loop and
  routing
"""

from sessiontree.testing._script import (
    Fault,
    FaultKind,
    Reply,
    StandinStats,
    ToolCall,
    completion_tokens,
    count_tokens,
    prompt_tokens,
)
from sessiontree.testing._server import StandinServer

__all__ = [
    "Fault",
    "FaultKind",
    "Reply",
    "StandinServer",
    "StandinStats",
    "ToolCall",
    "completion_tokens",
    "count_tokens",
    "prompt_tokens",
]
