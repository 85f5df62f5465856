"""Strict request bodies: decoded by our codec before the framework decodes
them, and their schemas closed to unknown fields.

Litestar's own decoding would coerce (``"5"`` for a number) and accept
unknown fields; ``strict_body`` runs first, as the app's ``before_request``
hook, and refuses such a body with ``RejectedInputError`` (a 400 naming the
field, or 413 for a body over the cap) before any handler runs.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Litestar, Request
from litestar.datastructures import State
from litestar.openapi.spec import OpenAPIType, Schema

from sessiontree.cli._wire import (
    BranchRequest,
    CancelRequest,
    ConfirmDeleteRequest,
    ForkRequest,
    MainRequest,
    SendRequest,
    TerminateRequest,
)
from sessiontree.cli.server._shared import count_rejected
from sessiontree.protocol import (
    MAX_BUDGET_COST,
    MAX_BUDGET_COUNT,
    Budget,
    Inbound,
    RejectedInputError,
    SpawnSpec,
    decode_strict,
)

__all__ = ["close_request_schemas", "strict_body"]

# every Struct a handler takes as its body, or that one holds
_STRICT_BODIES: tuple[type[msgspec.Struct], ...] = (
    MainRequest,
    SpawnSpec,
    Budget,
    SendRequest,
    Inbound,
    ForkRequest,
    BranchRequest,
    ConfirmDeleteRequest,
    CancelRequest,
    TerminateRequest,
)

_DECODERS: dict[Any, msgspec.json.Decoder[Any]] = {}


async def strict_body(request: Request[Any, Any, State]) -> None:
    """Decode the body strictly before Litestar does (which would coerce).

    A body over the cap, too deeply nested, malformed, with an unknown field
    or a value of the wrong type raises ``RejectedInputError`` (counted in the
    metrics by its reason); a handler without a body is let through."""
    data = request.route_handler.parsed_fn_signature.parameters.get("data")
    if data is None:
        return
    target = data.annotation
    decoder = _DECODERS.get(target)
    if decoder is None:
        decoder = _DECODERS[target] = msgspec.json.Decoder(target)
    raw = await request.body()
    if not raw and not data.is_required:  # an optional body left out
        return
    try:
        decode_strict(raw, decoder, max_bytes=request.app.state.max_body)
    except RejectedInputError as exc:
        # counted here, where the API refuses it; what the node itself refuses
        # (Node.route, Node.control) the node counts
        count_rejected(request, exc.reason)
        raise


def close_request_schemas(app: Litestar) -> None:
    """Say ``additionalProperties: false`` for every request Struct that forbids
    unknown fields (Litestar's schema leaves it out), so clients and fuzzers
    know an extra field is refused. A Struct missing from the schema is
    skipped."""
    components = app.openapi_schema.components
    schemas = components.schemas if components is not None else None
    for struct in _STRICT_BODIES:
        schema = (schemas or {}).get(struct.__name__)
        if isinstance(schema, Schema) and struct.__struct_config__.forbid_unknown_fields:
            schema.additional_properties = False
    budget = (schemas or {}).get("Budget")
    if isinstance(budget, Schema) and budget.properties:
        _bound_budget(budget.properties)


def _bound_budget(properties: dict[str, Any]) -> None:
    """Litestar leaves out a bound of 0 and puts the others beside a nullable
    field's ``oneOf``: each bound goes inside the branch it bounds, so a
    schema-valid budget is one the node takes."""
    for name, kind, most in (
        ("tokens", OpenAPIType.INTEGER, MAX_BUDGET_COUNT),
        ("calls", OpenAPIType.INTEGER, MAX_BUDGET_COUNT),
        ("descendants", OpenAPIType.INTEGER, MAX_BUDGET_COUNT),
        ("cost", OpenAPIType.NUMBER, MAX_BUDGET_COST),
    ):
        properties[name] = Schema(
            one_of=[
                Schema(type=kind, minimum=0, maximum=most),
                Schema(type=OpenAPIType.NULL),
            ]
        )
