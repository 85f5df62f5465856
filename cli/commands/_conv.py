"""``sessiontree conv``: a session's conversation tree, from a node or a store directory.

With ``--node URL`` every command goes through the running node's HTTP
API. With ``--store DIR``, read commands (``branches``, ``context``,
``tree``, ``transcript``) open the store read-only, so they work beside a
running node; commands that change the tree (``fork``, ``checkout``,
``merge``, ``delete-branch``) open it for writing, which a running node
refuses (one writer per store): use ``--node`` then. Pick the session by
``--session ID``, or by ``--agent`` and ``--key`` (its Main).

Exit codes: 0 done; 1 the store, the session, a message or a branch cannot
be found or written (one line on stderr names it); 2 a usage error; 69 no
node answered at ``--node``.
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click
import msgspec

from sessiontree.actors import RealClock
from sessiontree.cli._client import NODE_OPTION, STORE_ENV, NodeClient, resolve_source
from sessiontree.cli._exits import failure
from sessiontree.cli._ids import node_candidates, resolve_id, store_candidates
from sessiontree.cli._text import echo, shown
from sessiontree.cli._words import plural
from sessiontree.conversations import Conversation, Conversations, nested_json, preview_text
from sessiontree.protocol import (
    MAIN_KEY,
    BranchInfo,
    DeletePlan,
    Merged,
    Message,
    SessionKey,
    SessionTreeError,
)
from sessiontree.store import Store
from sessiontree.supervision import StoreConversations

__all__ = ["conv"]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
_Target = tuple[str | None, Path | None, str | None, str | None, str]


def _fail(exc: BaseException | str) -> click.ClickException:
    return failure(exc)


class _Remote:
    """A conversation behind a node's HTTP API, with ``Conversation``'s methods
    (the ones these commands use), answering the same Structs."""

    def __init__(self, client: NodeClient, session_id: str) -> None:
        self._client = client
        self._path = f"/v1/sessions/{session_id}/conversation"

    def _get(self, path: str, kind: type[T], **params: Any) -> T:
        return msgspec.convert(self._client.get(self._path + path, **params), kind)

    def _post(self, path: str, body: dict[str, Any], kind: type[T]) -> T:
        return msgspec.convert(self._client.post(self._path + path, body), kind)

    def branches(self) -> list[BranchInfo]:
        return self._get("/branches", list[BranchInfo])

    def context(self, limit: int) -> list[Message]:
        return self._get("/context", list[Message], limit=limit)

    def export_tree(self, fmt: str) -> str:
        if fmt == "json":
            return nested_json(self._client.get(self._path + "/tree"))
        return self._client.text(self._path + ("/tree.txt" if fmt == "text" else "/tree.html"))

    def transcript(self) -> Iterator[str]:
        yield from self._client.text(self._path + "/transcript").splitlines(keepends=True)

    def fork(self, from_id: str, name: str | None) -> BranchInfo:
        return self._post("/fork", {"from_message_id": from_id, "name": name}, BranchInfo)

    def checkout(self, branch: str) -> BranchInfo:
        return self._post("/checkout", {"branch": branch}, BranchInfo)

    def merge(self, branch: str) -> Merged:
        return self._post("/merge", {"branch": branch}, Merged)

    def delete_branch(self, branch: str) -> DeletePlan:
        return self._post("/delete-branch", {"branch": branch}, DeletePlan)

    def confirm_delete(self, token: str, branch: str) -> DeletePlan:
        body = {"branch": branch, "token": token}
        return self._post("/delete-branch/confirm", body, DeletePlan)


@contextlib.contextmanager
def _conversation(target: _Target, *, write: bool) -> Iterator[Conversation | _Remote]:
    """Yield the session's conversation, through the node or from the store;
    errors exit 1 (69 when the node does not answer)."""
    node_url, store_dir, session, agent, key = target
    source = resolve_source(node_url, store_dir)
    store_dir = source.store_dir
    if source.node_url is not None:
        with source.client() as client:
            if session is not None:
                sid = resolve_id(session, node_candidates(client), hint="--session")
            elif agent is None:
                raise click.UsageError("give --session ID, or --agent (and --key) to pick a Main")
            else:
                sid = client.main_of(agent, key)
            yield _Remote(client, sid)
        return
    assert store_dir is not None
    try:
        with Store(store_dir, readonly=not write) as store:
            yield Conversations(StoreConversations(store), RealClock()).get(
                _session_id(store, session, agent, key)
            )
    except (SessionTreeError, OSError) as exc:
        raise _fail(exc) from exc


def _session_id(store: Store, session: str | None, agent: str | None, key: str) -> uuid.UUID:
    if session is not None:
        sid = uuid.UUID(resolve_id(session, store_candidates(store), hint="--session"))
        if store.session(sid) is None:
            raise _fail(f"no session {sid} in {store.path}")
        return sid
    if agent is None:
        raise click.UsageError("give --session ID, or --agent (and --key) to pick a Main")
    try:
        key = str(SessionKey.parse(key))
    except SessionTreeError as exc:
        raise click.BadParameter(str(exc), param_hint="--key") from None
    main = store.main_of(agent, key)
    if main is None:
        raise _fail(f"agent {agent!r} has no Main for key {key} in {store.path}")
    return main


def _target(command: F) -> F:
    """The options that pick a conversation: --session, or --agent/--key; and
    --node or --store. The command receives them as one ``target`` tuple."""

    @functools.wraps(command)
    def wrapper(
        node_url: str | None,
        store_dir: Path | None,
        session: str | None,
        agent: str | None,
        key: str,
        **rest: Any,
    ) -> Any:
        return command(target=(node_url, store_dir, session, agent, key), **rest)

    options = [
        click.option(
            "--key",
            default=MAIN_KEY,
            show_default=True,
            help="With --agent: the Main's session key.",
        ),
        click.option("--agent", default=None, help="Pick the Main of this agent."),
        click.option("--session", default=None, help="The session's id, or a unique prefix of it."),
        click.option(
            "--store",
            "store_dir",
            envvar=STORE_ENV,
            default=None,
            metavar="DIR",
            type=click.Path(file_okay=False, path_type=Path),
            help="The node's store directory (read-only for reads; writes need the node "
            "stopped; env SESSIONTREE_STORE).",
        ),
        NODE_OPTION,
    ]
    decorated: Any = wrapper
    for option in options:
        decorated = option(decorated)
    return decorated  # type: ignore[no-any-return]


_JSON = click.option("--json", "as_json", is_flag=True, help="Only JSON on stdout.")


def _echo_json(value: Any) -> None:
    echo(msgspec.json.encode(value).decode())


def _show(value: Any, as_json: bool, line: str) -> None:
    """``value`` as JSON, or ``line`` for a person."""
    if as_json:
        _echo_json(value)
    else:
        echo(line)


def _branch_line(branch: BranchInfo) -> str:
    mark = "*" if branch.current else " "
    last = branch.last_message
    said = "" if last is None else f'  "{preview_text(last.content)}"'
    count = plural(branch.message_count, "message")
    return shown(f"{mark} {branch.number:>3}  {branch.name}  ({count}){said}")


@click.group("conv")
def conv() -> None:
    """A session's conversation tree: branches, context, fork, checkout, merge, delete."""


@conv.command("branches")
@_target
@_JSON
def branches_cmd(target: _Target, as_json: bool) -> None:
    """List the branches (* marks the current one)."""
    with _conversation(target, write=False) as conversation:
        found = conversation.branches()
    if as_json:
        _echo_json(found)
        return
    for branch in found:
        echo(_branch_line(branch))


@conv.command("context")
@_target
@click.option(
    "--limit",
    default=20,
    show_default=True,
    type=click.IntRange(0, 10_000),
    help="At most this many messages of the active path.",
)
@_JSON
def context_cmd(target: _Target, limit: int, as_json: bool) -> None:
    """What the agent sees: the active path, oldest first, at most --limit messages."""
    with _conversation(target, write=False) as conversation:
        messages = conversation.context(limit)
    if as_json:
        _echo_json([m.to_spec() for m in messages])
        return
    for message in messages:
        echo(shown(f"{message.role.value:>9}: {preview_text(message.content, 100)}"))


@conv.command("tree")
@_target
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "html"]),
    default="text",
    show_default=True,
    help="text (an outline), json (nested) or html (one self-contained page).",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the export to this file instead of stdout.",
)
def tree_cmd(target: _Target, fmt: str, out: Path | None) -> None:
    """Export the tree (text, nested JSON, or one self-contained HTML page)."""
    with _conversation(target, write=False) as conversation:
        content = conversation.export_tree(fmt)
    if out is None:
        echo(content, nl=not content.endswith("\n"))  # control characters escaped
        return
    try:
        out.write_text(content, encoding="utf-8")
    except OSError as exc:
        raise _fail(exc) from exc
    echo(f"wrote {fmt} tree to {out}", err=True)


@conv.command("transcript")
@_target
def transcript_cmd(
    target: _Target,
) -> None:
    """The transcript as JSONL (one message a line, in the order written)."""
    with _conversation(target, write=False) as conversation:
        for line in conversation.transcript():
            echo(line, nl=False)  # JSON: escaped control characters stay exact


@conv.command("fork")
@_target
@click.option("--from", "from_id", required=True, help="The message id to branch from.")
@click.option("--name", default=None, help="The new branch's name (default branch-N).")
@_JSON
def fork_cmd(
    target: _Target,
    from_id: str,
    name: str | None,
    as_json: bool,
) -> None:
    """Start a branch from a message; it becomes current."""
    with _conversation(target, write=True) as conversation:
        branch = conversation.fork(from_id, name)
    _show(branch, as_json, f"forked: {_branch_line(branch)}")


@conv.command("checkout")
@_target
@click.argument("branch")
@_JSON
def checkout_cmd(target: _Target, branch: str, as_json: bool) -> None:
    """Switch to BRANCH (a number, a name, or a message id)."""
    with _conversation(target, write=True) as conversation:
        current = conversation.checkout(branch)
    _show(current, as_json, f"current: {_branch_line(current)}")


@conv.command("merge")
@_target
@click.argument("branch")
@_JSON
def merge_cmd(target: _Target, branch: str, as_json: bool) -> None:
    """Copy BRANCH's own messages onto the current branch (both stay)."""
    with _conversation(target, write=True) as conversation:
        merged = conversation.merge(branch)
    counts = f"{plural(len(merged.messages), 'message')} of {merged.source_name} into "
    counts += merged.into_name
    _show(merged, as_json, shown(f"merged {counts}"))


@conv.command("delete-branch")
@_target
@click.argument("branch")
@click.option("--confirm", "token", default=None, help="The token the first step printed.")
@_JSON
def delete_branch_cmd(
    target: _Target,
    branch: str,
    token: str | None,
    as_json: bool,
) -> None:
    """Delete BRANCH in two steps: without --confirm, show what would go and the token."""
    with _conversation(target, write=token is not None) as conversation:
        if token is None:
            plan = conversation.delete_branch(branch)
        else:
            plan = conversation.confirm_delete(token, branch)
    if as_json:
        _echo_json(plan)
    elif token is None:
        echo(
            f"branch {plan.number} ({shown(plan.name)}): {plural(plan.count, 'message')} would be "
            f"deleted, {plan.kept} kept"
        )
        for text in plan.preview:
            echo(f"  - {shown(text)}")
        echo(f"confirm with: --confirm {shown(plan.token)}")
    else:
        echo(f"deleted branch {plan.number} ({shown(plan.name)}): {plural(plan.count, 'message')}")
