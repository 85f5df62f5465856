"""Making the node's HTTP contract true where Litestar leaves it short: the
``Allow`` of every path, the grammar of a session key, and the OpenAPI links
that feed one operation's session id to the next.

- ``Allow``: Litestar 2's automatic ``OPTIONS`` answer lists only the methods
  of the first handler registered on a path (its closure keeps the first
  route object when a second handler joins the path and the route is
  rebuilt; litestar-org/litestar#4169, fixed only in v3). ``fix_allow``
  points each automatic ``OPTIONS`` handler at the route that serves the
  path, so ``OPTIONS /v1/sessions`` answers ``GET, OPTIONS, POST``.
- ``key``: the schema gives a session key its grammar (``SessionKey``), so a
  key valid by the schema is one the node takes.
- a spawn: its ``ttl`` within (0, the node's ``max_ttl``], its ``backend``
  one of ``BACKENDS``, so a spawn valid by the schema is refused only for
  what the schema cannot know (the parent's state, the tree's limits, a
  skill the parent's agent lacks: 404 ``unknown_skill``).
- links: a created or spawned session's id feeds every operation on
  ``/v1/sessions/{session_id}…``, so a client or a stateful fuzzer can walk
  from a new session to its show, cancel, messages, result, tree…

Each step runs once, when the app is built; a Litestar whose routes no longer
look as expected is left as it is (the contract tests then fail loudly).
"""

from __future__ import annotations

from litestar import Litestar
from litestar.openapi.spec import (
    Link,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    PathItem,
    RequestBody,
    Schema,
)
from litestar.routes import HTTPRoute

from sessiontree.actors.backends import BACKENDS
from sessiontree.protocol import MAX_REASON_CHARS, SCOPES

__all__ = ["SESSION_KEY_PATTERN", "document_contract", "fix_allow"]

# ends with "nothing follows" rather than "$": in Python's reading (and so in
# what a generator draws) "$" also matches before a final newline, which
# SessionKey refuses
SESSION_KEY_PATTERN = (
    r"^[a-z][a-z0-9_-]{0,31}:(" + "|".join(SCOPES) + r"):[A-Za-z0-9._+@/-]{1,256}(?![\s\S])"
)
"""``{provider}:{scope}:{identifier}`` as ``SessionKey`` parses it."""

_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")

# (path, method, status) → the JSON pointer of the id its body carries, and the
# path parameter that id fills
_SOURCES: tuple[tuple[str, str, str, str, str], ...] = (
    ("/v1/sessions", "post", "200", "/info/session_id", "session_id"),
    ("/v1/sessions/{session_id}/children", "post", "201", "/info/session_id", "session_id"),
)


def fix_allow(app: Litestar) -> int:
    """Point every automatic ``OPTIONS`` handler at the route serving its path
    (see the module's docstring); returns how many were rebound."""
    rebound = 0
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        found = route.route_handler_map.get("OPTIONS")
        if found is None:
            continue
        fn = found[0].fn
        code = getattr(fn, "__code__", None)
        closure = getattr(fn, "__closure__", None)
        if code is None or closure is None or code.co_freevars != ("self",):
            continue  # not Litestar's automatic handler: one of ours, or a changed Litestar
        cell = closure[0]
        if isinstance(cell.cell_contents, HTTPRoute) and cell.cell_contents is not route:
            cell.cell_contents = route
            rebound += 1
    return rebound


def _operations(item: PathItem) -> list[Operation]:
    return [op for op in (getattr(item, m, None) for m in _METHODS) if isinstance(op, Operation)]


def _properties(app: Litestar, name: str) -> dict[str, object]:
    components = app.openapi_schema.components
    schemas = (components.schemas if components is not None else None) or {}
    schema = schemas.get(name)
    if isinstance(schema, Schema) and schema.properties:
        return schema.properties  # type: ignore[return-value]
    return {}


def _key_pattern(app: Litestar) -> None:
    key = _properties(app, "MainRequest").get("key")
    if isinstance(key, Schema):
        key.pattern = SESSION_KEY_PATTERN


def _cancel_bounds(app: Litestar) -> None:
    cancel = _properties(app, "CancelRequest")
    if "grace" in cancel:  # Litestar drops the bound of an optional number
        cancel["grace"] = Schema(
            one_of=[Schema(type=OpenAPIType.NUMBER, minimum=0), Schema(type=OpenAPIType.NULL)]
        )
    for body in ("CancelRequest", "TerminateRequest"):
        fields = _properties(app, body)
        if "reason" in fields:  # and of an optional string
            fields["reason"] = Schema(
                one_of=[
                    Schema(type=OpenAPIType.STRING, max_length=MAX_REASON_CHARS),
                    Schema(type=OpenAPIType.NULL),
                ]
            )


def _spawn_bounds(app: Litestar, max_ttl: float) -> None:
    spec = _properties(app, "SpawnSpec")
    if "ttl" in spec:
        spec["ttl"] = Schema(
            one_of=[
                Schema(type=OpenAPIType.NUMBER, exclusive_minimum=0, maximum=max_ttl),
                Schema(type=OpenAPIType.NULL),
            ]
        )
    if "backend" in spec:
        spec["backend"] = Schema(
            one_of=[
                Schema(type=OpenAPIType.STRING, enum=list(BACKENDS)),
                Schema(type=OpenAPIType.NULL),
            ]
        )


# Operations whose body may be left out (Litestar marks every body required).
_OPTIONAL_BODIES = (
    ("/v1/sessions/{session_id}/cancel", "post"),
    ("/v1/sessions/{session_id}/terminate", "post"),
)


def _optional_bodies(app: Litestar) -> None:
    paths = app.openapi_schema.paths or {}
    for path, method in _OPTIONAL_BODIES:
        operation = getattr(paths.get(path), method, None)
        if isinstance(operation, Operation) and isinstance(operation.request_body, RequestBody):
            operation.request_body.required = False


def _links(app: Litestar) -> None:
    paths = app.openapi_schema.paths or {}
    targets: dict[str, dict[str, str]] = {"session_id": {}}
    for path, item in paths.items():
        for param, named in targets.items():
            if "{" + param + "}" in path:
                for op in _operations(item):
                    if op.operation_id:
                        named[op.operation_id] = op.operation_id
    for source, method, status, pointer, param in _SOURCES:
        found = paths.get(source)
        operation = getattr(found, method, None) if found is not None else None
        response = (
            (operation.responses or {}).get(status) if isinstance(operation, Operation) else None
        )
        if not isinstance(response, OpenAPIResponse):
            continue
        response.links = {
            name: Link(
                operation_id=name,
                parameters={param: f"$response.body#{pointer}"},
                description=f"The {param} this answer carries ({pointer}).",
            )
            for name in sorted(targets[param])
        }


def document_contract(app: Litestar, max_ttl: float) -> None:
    """Give the app's OpenAPI document the session key's grammar, a spawn's
    bounds (``max_ttl``: the node's) and the links between operations (see
    the module's docstring)."""
    _key_pattern(app)
    _spawn_bounds(app, max_ttl)
    _cancel_bounds(app)
    _optional_bodies(app)
    _links(app)
