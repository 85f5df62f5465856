"""The tree's operations: finding, forking, checking out, merging and deleting branches.

Each runs under the conversation's lock on the acknowledged state the handle
passed in (no write in flight), and writes through ``SharedConversation``.
"""

from __future__ import annotations

import hashlib
import re
import uuid

import msgspec

from sessiontree.conversations._text import preview_text
from sessiontree.conversations._values import (
    BranchRef,
    check_branch_name,
    draft,
    maybe_uuid,
    new_branch_id,
    placed_id,
)
from sessiontree.conversations._writes import SharedConversation
from sessiontree.protocol import (
    Branch,
    BranchInfo,
    ConversationState,
    DeletePlan,
    ErrorCode,
    Merged,
    Message,
    RejectedInputError,
)

__all__ = [
    "branch_info",
    "chain",
    "checkout",
    "confirm_delete",
    "current",
    "find_branch",
    "fork",
    "merge",
    "own_messages",
    "placed",
    "plan_delete",
    "with_branch",
]

_PREVIEW = 3  # messages a delete plan previews
_NUMBER = re.compile(r"[0-9]{1,9}")  # a branch number (not "²", not 5,000 digits)


def current(state: ConversationState) -> Branch:
    """The branch ``append`` writes to."""
    return next(b for b in state.branches if b.id == state.current)


def find_branch(
    shared: SharedConversation, state: ConversationState, ref: BranchRef, field: str
) -> Branch:
    """A branch by number (int or digits), id or name."""
    number: int | None = None
    if isinstance(ref, bool) or not isinstance(ref, int | str):
        msg = f"{field} must be a branch number or name, got {type(ref).__name__}"
        raise RejectedInputError(msg, field=field)
    if isinstance(ref, int):
        number = ref
    elif _NUMBER.fullmatch(ref.strip()):
        number = int(ref.strip())
    for branch in state.branches:
        if (number is not None and branch.number == number) or branch.name == ref:
            return branch
        if branch.id == ref:
            return branch
    shown = ", ".join(f"{b.number} {b.name}" for b in state.branches)
    raise shared.error(f"no branch {ref!r} (branches: {shown})", ErrorCode.UNKNOWN_BRANCH, field)


def own_messages(shared: SharedConversation, branch: Branch) -> list[Message]:
    """The branch's own messages, newest first."""
    if branch.leaf_id is None:
        return []
    return shared.backend.walk(shared.session_id, branch.leaf_id, branch.count, branch.id)


def branch_info(shared: SharedConversation, state: ConversationState, branch: Branch) -> BranchInfo:
    """What ``branches()`` says of ``branch``: its tip, last message, counts and age."""
    tip = branch.tip
    last = None if tip is None else shared.backend.message(shared.session_id, tip)
    return BranchInfo(
        number=branch.number,
        id=branch.id,
        name=branch.name,
        current=branch.id == state.current,
        base_id=branch.base_id,
        leaf_id=tip,
        last_message=last,
        message_count=0 if last is None else last.depth,
        own_messages=branch.count,
        age_s=max(0.0, shared.clock.time() - branch.updated_at),
        session_id=branch.session_id,
    )


def with_branch(
    state: ConversationState, branch: Branch, *, next_seq: int, updated_at: float
) -> ConversationState:
    """``state`` with ``branch`` replaced and the messages up to ``next_seq`` counted."""
    return msgspec.structs.replace(
        state,
        branches=[branch if b.id == branch.id else b for b in state.branches],
        next_seq=next_seq,
        messages=state.messages + next_seq - state.next_seq,
        updated_at=updated_at,
    )


def placed(
    drafts: list[Message],
    *,
    tip: uuid.UUID | None,
    depth: int,
    seq: int,
    branch_id: str,
    now: float,
) -> list[Message]:
    """``drafts`` as the messages after ``tip`` (at ``depth``, numbered from
    ``seq``) on ``branch_id``: each with its id (a new one unless the draft was
    given one), its parent, place and time."""
    out: list[Message] = []
    for message in drafts:
        depth += 1
        message = msgspec.structs.replace(  # noqa: PLW2901 - the draft, placed
            message,
            id=placed_id(message),
            parent_id=tip,
            timestamp=now,
            branch_id=branch_id,
            seq=seq,
            depth=depth,
        )
        out.append(message)
        tip, seq = message.id, seq + 1
    return out


def chain(
    state: ConversationState, branch: Branch, drafts: list[Message], now: float
) -> tuple[ConversationState, list[Message]]:
    """``drafts`` placed at the tip of ``branch`` (see ``placed``), and the state
    after them (``state`` itself when there are none)."""
    messages = placed(
        drafts, tip=branch.tip, depth=branch.depth, seq=state.next_seq, branch_id=branch.id, now=now
    )
    if not messages:
        return state, messages
    last = messages[-1]
    grown = msgspec.structs.replace(
        branch,
        leaf_id=last.id,
        count=branch.count + len(messages),
        depth=last.depth,
        updated_at=now,
    )
    return with_branch(state, grown, next_seq=last.seq + 1, updated_at=now), messages


def fork(
    shared: SharedConversation, state: ConversationState, base: Message, name: str | None
) -> BranchInfo:
    """A new branch under ``base``, made current and written."""
    number = state.next_number
    name = f"branch-{number}" if name is None else check_branch_name(name)
    if any(b.name == name for b in state.branches):
        if name == f"branch-{number}":
            name = f"branch-{number}-{uuid.uuid4().hex[:4]}"
        else:
            msg = f"a branch named {name!r} exists"
            raise shared.error(msg, ErrorCode.BRANCH_EXISTS, "name")
    now = shared.clock.time()
    branch = Branch(
        number=number,
        id=new_branch_id(),
        name=name,
        base_id=base.id,
        created_at=now,
        updated_at=now,
        depth=base.depth,
    )
    forked = msgspec.structs.replace(
        state,
        branches=[*state.branches, branch],
        current=branch.id,
        next_number=number + 1,
        updated_at=now,
    )
    shared.commit_now(forked)
    return branch_info(shared, forked, branch)


def checkout(shared: SharedConversation, state: ConversationState, target: BranchRef) -> BranchInfo:
    """Make a branch current (by number, name, or the message id of its tip;
    any other message forks an unnamed branch there)."""
    message_id = maybe_uuid(target)
    if message_id is not None:
        target_message = shared.need(message_id, "target")
        tipped = [b for b in state.branches if b.tip == message_id]
        if not tipped:
            return fork(shared, state, target_message, None)
        branch = next((b for b in tipped if b.id == state.current), tipped[0])
    else:
        branch = find_branch(shared, state, target, "target")
    if branch.id != state.current:
        state = msgspec.structs.replace(
            state,
            current=branch.id,
            updated_at=shared.clock.time(),
        )
        shared.commit_now(state)
    return branch_info(shared, state, branch)


def merge(shared: SharedConversation, state: ConversationState, source: BranchRef) -> Merged:
    """Copy the source branch's own messages onto the current branch (``merged_from``)."""
    src = find_branch(shared, state, source, "source")
    into = current(state)
    if src.id == into.id:
        raise shared.error(
            f"branch {src.number} ({src.name}) is the current branch; merge another branch into it",
            ErrorCode.CURRENT_BRANCH,
            "source",
        )
    own = own_messages(shared, src)
    own.reverse()
    drafts = [
        draft(m.role, m.content, tool_calls=m.tool_calls, usage=m.usage, merged_from=m.id)
        for m in own
    ]
    merged, copies = chain(state, into, drafts, shared.clock.time())
    if copies:
        shared.commit_now(merged, copies)
    return Merged(
        source_number=src.number,
        source_name=src.name,
        into_number=into.number,
        into_name=into.name,
        messages=copies,
    )


def plan_delete(
    shared: SharedConversation, state: ConversationState, branch: Branch
) -> tuple[DeletePlan, list[Message]]:
    """What deleting ``branch`` would remove (oldest first: only what no other
    branch grows from), and the plan that names it."""
    if branch.id == state.current:
        raise shared.error(
            f"branch {branch.number} ({branch.name}) is the current branch; check out "
            "another branch first",
            ErrorCode.CURRENT_BRANCH,
            "branch",
        )
    # newest first: its own, then what deleted branches left above its base
    own = own_messages(shared, branch) + _left_above(shared, state, branch)
    own_ids = {m.id: m.depth for m in own}
    floor = own[-1].depth if own else 0  # the shallowest own message
    needed_depth = 0  # own messages at or above this depth stay
    for other in state.branches:
        if other.id == branch.id or other.base_id is None:
            continue
        walked: uuid.UUID | None = other.base_id
        while walked is not None:
            if walked in own_ids:
                needed_depth = max(needed_depth, own_ids[walked])
                break
            found = shared.backend.message(shared.session_id, walked)
            if found is None or found.depth <= floor:
                break
            walked = found.parent_id
    doomed = [m for m in own if m.depth > needed_depth]
    doomed.reverse()
    digest = hashlib.sha256(
        f"{shared.session_id}|{branch.id}|{branch.leaf_id}|{branch.count}|{len(doomed)}".encode()
    ).hexdigest()[:16]
    plan = DeletePlan(
        number=branch.number,
        branch_id=branch.id,
        name=branch.name,
        count=len(doomed),
        kept=len(own) - len(doomed),
        preview=[preview_text(m.content) for m in doomed[:_PREVIEW]],
        token=f"{branch.number}-{digest}",
    )
    return plan, doomed


def _left_above(
    shared: SharedConversation, state: ConversationState, branch: Branch
) -> list[Message]:
    """The messages of deleted branches on the way up from ``branch``'s base,
    newest first: kept when their branch went because this one grew from them,
    they go with it unless another branch grows from them too."""
    live = {b.id for b in state.branches}
    left: list[Message] = []
    walked = branch.base_id
    while walked is not None:
        message = shared.backend.message(shared.session_id, walked)
        if message is None or message.branch_id in live:
            break
        left.append(message)
        walked = message.parent_id
    return left


def confirm_delete(
    shared: SharedConversation, state: ConversationState, token: str, branch: BranchRef | None
) -> DeletePlan:
    """Delete the branch ``token``'s plan names if the plan still holds (and is
    of ``branch`` when given); else ``confirmation_mismatch``."""
    if branch is None:
        target = find_branch(shared, state, int(token.split("-", 1)[0]), "token")
    else:
        target = find_branch(shared, state, branch, "branch")
    plan, doomed = plan_delete(shared, state, target)
    if plan.token != token:
        why = (
            "changed since its deletion was planned; plan it again"
            if branch is None
            else f"has no plan with token {token[:64]!r}"
        )
        raise shared.error(
            f"branch {target.number} {why}", ErrorCode.CONFIRMATION_MISMATCH, "token"
        )
    number = target.number
    pending = {k: v for k, v in state.pending_deletes.items() if k != str(number)}
    pruned = msgspec.structs.replace(
        state,
        branches=[b for b in state.branches if b.number != number],
        messages=state.messages - len(doomed),
        updated_at=shared.clock.time(),
        pending_deletes=pending,
    )
    shared.commit_now(pruned, (), doomed)
    return plan
