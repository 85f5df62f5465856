"""Model calls across a backend's wire: a step's ``ModelCall`` to the node, its
``Completion`` back.

A remote step never calls a model itself: it sends the call to the node
(a ``("complete", (call_id, bytes))`` event), which reserves, sends and
settles it like an inline session's, and answers with
``RemoteRun.answer(call_id, completion)``. Both travel as msgpack, decoded
into their one type, so what crosses is plain data whatever the backend's
own serialisation (pickle, Ray's) would have carried.
"""

from __future__ import annotations

import msgspec

from sessiontree.actors._host import ModelCall
from sessiontree.protocol import Completion, ErrorCode, ErrorInfo

__all__ = ["decode_call", "decode_completion", "encode_call", "encode_completion"]

_ENCODER = msgspec.msgpack.Encoder()
_CALLS = msgspec.msgpack.Decoder(ModelCall)
_COMPLETIONS = msgspec.msgpack.Decoder(Completion)


def encode_call(call: ModelCall) -> bytes:
    """``call`` as the node receives it (``TypeError`` for an option that is
    not plain data; ``model_call`` has checked them already)."""
    return _ENCODER.encode(call)


def decode_call(data: bytes) -> ModelCall | ErrorInfo:
    """The call a step sent, or ``rejected_input`` naming what does not decode."""
    try:
        return _CALLS.decode(data)
    except (msgspec.DecodeError, TypeError) as exc:
        return ErrorInfo(
            code=ErrorCode.REJECTED_INPUT,
            message=f"a remote step's model call could not be read: {exc}",
            detail={"field": "call"},
        )


def encode_completion(completion: Completion) -> bytes:
    """``completion`` as the step receives it."""
    return _ENCODER.encode(completion)


def decode_completion(data: bytes) -> Completion:
    """The node's answer to a call (``msgspec.DecodeError`` if it is not one)."""
    return _COMPLETIONS.decode(data)
