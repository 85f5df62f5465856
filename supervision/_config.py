"""Node settings and agent registrations."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

import msgspec

from sessiontree.actors import Compaction
from sessiontree.actors.backends import BACKENDS
from sessiontree.actors.runtime import is_async_skill
from sessiontree.protocol import Budget, DmScope, SessionKind
from sessiontree.supervision._providers import Price, Provider
from sessiontree.supervision._tracing_config import Tracing

__all__ = ["Agent", "NodeConfig", "Price", "Provider", "removed_setting"]

Skill = Callable[[Any], Any]

MEMORY_SCOPES = ("agent", "tree")  # what shared memory is shared by (NodeConfig.memory_scope)

MAIN_SKILL = "main"  # the skill that runs Main cycles when main_skill names none

_ONE_MODE = (
    "a node has one execution mode: the Cortex and every session actor on the"
    " node's event loop, sync skills' steps on the step threads, async skills on"
    " the loop; drop the setting"
)

# NodeConfig settings that are gone, and why: a config that still names one
# (``NodeConfig(...)``, a ``[node]`` table, an environment variable, a flag) is refused.
_REMOVED: Mapping[str, str] = {
    "actor_type": "the thread-per-session and pooled actor types are gone: " + _ONE_MODE,
    "dispatch": "serving actors on a pool of threads is gone: " + _ONE_MODE,
    "dispatcher_threads": "the pool of dispatcher threads is gone: " + _ONE_MODE,
}


def removed_setting(name: str) -> str | None:
    """Why the NodeConfig setting ``name`` is refused if it was removed, else None."""
    why = _REMOVED.get(name)
    return None if why is None else f"NodeConfig.{name} was removed ({why})"


@dataclass(frozen=True)
class NodeConfig:
    """Limits and timings of one node; every duration is float seconds on the node's Clock.

    ``grace``: how long a cancelled session has to wrap up before it is
    terminated by force (0 = at once). ``max_step_threads``: threads for sync
    skills (live sync branches/workers plus zombies; past it a spawn of a sync
    skill is refused with ``capacity_exceeded``). ``max_running_skills``:
    compute slots (a spawn waits as ``pending`` for one; a skill waiting on
    children or parked holds none). ``max_sessions``/``max_zombies``: past
    either, spawns are refused with ``capacity_exceeded``. ``stuck_after``: a
    running skill with no checkpoint for that long is flagged (never killed).
    The Cortex and every session actor take their messages on the node's
    event loop, the thread async skills run on (sync skills' steps run on
    the step threads): an actor handler never blocks, and one still running
    after ``block_threshold`` real seconds is reported (logged and counted).
    A setting that was removed (``actor_type``, ``dispatch``,
    ``dispatcher_threads``) is refused with ``ValueError`` naming it.
    ``passivate_after``: a Main that
    took no message for that long is written out and its actor stopped (it
    holds no actor until its next message brings it back; None: never).
    ``backend``: where workers' skills run unless their spawn says otherwise
    (``inline``: this process; ``process``: a pool of ``process_workers``
    processes, one per CPU by default; ``ray``: ``ray_actors`` Ray actors of
    ``ray_num_cpus`` each on the cluster at ``ray_address``, a local one
    when None). Branches run inline unless their spawn names a backend; Mains
    always run inline. The node's backend starts with the node; another one
    starts when a spawn first names it (``ray`` only if the application
    initialised Ray: Ray must be started on the main thread).
    Memory pressure is read every ``check_interval``: at or past
    ``memory_high`` (a fraction of the memory the node may use; default 0.90)
    the Cortex asks the least recently active running branch to suspend (one
    per check); below ``memory_low`` (default 0.80; it must be below
    ``memory_high``) it resumes one branch that pressure suspended, the
    oldest-created first; between the marks nothing changes. Branches
    suspended by a caller are never resumed by it. The reading comes from the
    built-in probe (``MemoryProbe``: the cgroup's memory limit and use where
    there is one, else the machine's memory) unless ``memory_probe`` is False,
    or from ``memory_pressure`` when given: a callable returning the fraction
    in use, None for no reading, or a bool (True reads as past the high mark,
    False as below the low mark); either probe is called on the clock's timer
    thread, never on the Cortex's turn. ``check_interval`` also paces passivation
    and the stuck check (a
    check looks at up to 10,000 sessions; a node holding more is swept over
    several checks, so a stuck skill may be flagged a few intervals later
    than ``stuck_after``). With a store:
    ``export_path`` (a canonical JSONL export of the store, rewritten every
    ``housekeeping_interval``) and ``prune_after`` (terminal sessions that
    ended longer ago are deleted from the store on the same schedule,
    exported first when ``export_path`` is set); both off by default.
    ``gc_tuning`` (on by default): raise the process's garbage-collector
    thresholds while the node runs (young collections every 50,000 new
    objects instead of 700, full ones rarely): with the default collector a
    node running 1,000 fan-outs at once spent about half its time collecting.
    The setting is process-wide (the last node to close puts back what the
    first found); an application that tunes its own collector passes False.
    ``providers``: the model endpoints sessions call (``Provider``; names
    unique); an agent names one, or gets the first.

    Recovery, with a store: work a crash interrupted runs again (a Main's
    message, a branch a shutdown parked) unless crashes cut off
    ``recovery_attempts`` runs of it already (then it is held back as
    *wedged*), or it is older than ``recovery_max_age`` (None: no limit; then
    it is *stale*). A node whose runs crashed ``restart_intensity`` times
    within ``restart_period`` seconds starts with all replay held back until
    ``node.recovery.release_replay()`` (0: never held).

    ``memory_scope``: what shared memory (``session.remember``/``recall``)
    is shared by: ``"agent"`` (the default) every session of the agent,
    ``"tree"`` the sessions of one Main's tree only (a tree never spans two
    nodes, so this is the scope a cluster uses). A tree's memory lives in the
    scope ``tree:<root id>`` (the ``agent_id`` a ``MemorySpace`` is called with).

    ``tracing``: export every Branch and Worker run, Main message cycle and
    model call as an OpenTelemetry span (``Tracing``; needs the ``otlp``
    extra). None (the default): no span is made and nothing is imported.
    """

    grace: float = 30.0
    max_ttl: float = 7 * 24 * 3600.0
    max_step_threads: int = 256
    max_running_skills: int = 1024
    max_sessions: int = 100_000
    max_zombies: int = 64
    stuck_after: float = 300.0
    check_interval: float = 5.0
    memory_pressure: Callable[[], float | bool | None] | None = None
    memory_probe: bool = True
    memory_high: float = 0.90
    memory_low: float = 0.80
    block_threshold: float = 1.0
    ask_timeout: float = 30.0
    retain_terminal: int = 10_000
    max_retained_results: int = 1_000
    export_path: str | None = None
    prune_after: float | None = None
    housekeeping_interval: float = 3600.0
    passivate_after: float | None = 600.0
    backend: str = "inline"
    process_workers: int | None = None
    ray_address: str | None = None
    ray_actors: int = 2
    ray_num_cpus: float = 1.0
    gc_tuning: bool = True
    providers: tuple[Provider, ...] = ()
    recovery_attempts: int = 3
    recovery_max_age: float | None = None
    restart_intensity: int = 5
    restart_period: float = 300.0
    tracing: Tracing | None = None
    memory_scope: str = "agent"

    def __new__(cls, *_args: Any, **kwargs: Any) -> Self:
        # Before the dataclass's __init__, which would say only "unexpected
        # keyword argument": a removed setting is refused saying it is gone.
        for name in kwargs:
            why = removed_setting(name)
            if why is not None:
                raise ValueError(why)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        object.__setattr__(self, "providers", tuple(self.providers))
        _check_providers(self.providers)
        for names, ok, what in _RULES:
            for name in names:
                value = getattr(self, name)
                if not ok(value):
                    raise ValueError(f"NodeConfig.{name} must be {what}, got {value!r}")
        if not self.memory_low < self.memory_high:
            msg = (
                f"NodeConfig.memory_high ({self.memory_high!r}) must be above "
                f"NodeConfig.memory_low ({self.memory_low!r})"
            )
            raise ValueError(msg)


def _real(value: Any) -> bool:
    """A finite int or float (True and False count, as 1 and 0)."""
    return isinstance(value, int | float) and math.isfinite(value)


def _number(value: Any) -> bool:
    """A finite int or float, not True or False."""
    return _real(value) and not isinstance(value, bool)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: What each NodeConfig setting must be, in the order they are checked: the
#: settings, a test of a value, and the words a refusal says it must be.
_RULES: tuple[tuple[tuple[str, ...], Callable[[Any], bool], str], ...] = (
    (("recovery_attempts",), lambda v: _whole(v) and v >= 1, "an integer >= 1"),
    (("restart_intensity",), lambda v: _whole(v) and v >= 0, "an integer >= 0"),
    (("recovery_max_age",), lambda v: v is None or (_number(v) and v > 0), "a number > 0"),
    (("restart_period",), lambda v: _number(v) and v > 0, "a number > 0"),
    (
        ("prune_after", "passivate_after"),
        lambda v: v is None or (_real(v) and v > 0),
        "None or a number > 0",
    ),
    (("gc_tuning", "memory_probe"), lambda v: isinstance(v, bool), "True or False"),
    (("memory_pressure",), lambda v: v is None or callable(v), "None or a callable"),
    (
        ("memory_high", "memory_low"),
        lambda v: _number(v) and 0 < v <= 1,
        "a fraction in (0, 1]",
    ),
    (("export_path",), lambda v: v is None or isinstance(v, str), "None or a path string"),
    (("backend",), lambda v: v in BACKENDS, f"one of {list(BACKENDS)}"),
    (("memory_scope",), lambda v: v in MEMORY_SCOPES, f"one of {list(MEMORY_SCOPES)}"),
    (
        ("process_workers",),
        lambda v: v is None or (isinstance(v, int) and v >= 1),
        "None or an integer >= 1",
    ),
    (("ray_num_cpus",), lambda v: isinstance(v, int | float) and v >= 0, "a number >= 0"),
    (("ray_address",), lambda v: v is None or isinstance(v, str), "None or a string"),
    (("block_threshold",), lambda v: isinstance(v, int | float) and v > 0, "a number > 0"),
    (
        (
            "grace",
            "max_ttl",
            "stuck_after",
            "check_interval",
            "ask_timeout",
            "housekeeping_interval",
        ),
        lambda v: _real(v) and v >= 0,
        "a finite number >= 0",
    ),
    # a periodic check every 0 s would spin
    (("housekeeping_interval", "check_interval"), lambda v: v >= 0.01, ">= 0.01 s"),
    (
        (
            "max_step_threads",
            "max_running_skills",
            "max_sessions",
            "max_zombies",
            "retain_terminal",
            "max_retained_results",
            "ray_actors",
        ),
        lambda v: isinstance(v, int) and v >= 1,
        "an integer >= 1",
    ),
)


def _check_providers(providers: tuple[Provider, ...]) -> None:
    names: set[str] = set()
    for i, provider in enumerate(providers):
        if not isinstance(provider, Provider):
            msg = f"NodeConfig.providers[{i}] must be a Provider, got {provider!r}"
            raise ValueError(msg)
        if provider.name in names:
            msg = f"NodeConfig.providers: two providers are named {provider.name!r}"
            raise ValueError(msg)
        names.add(provider.name)


_DEFAULT_TTLS: Mapping[SessionKind, float | None] = {
    SessionKind.MAIN: None,
    SessionKind.BRANCH: 30 * 60.0,
    SessionKind.WORKER: 5 * 60.0,
}


@dataclass(frozen=True)
class Agent:
    """A registration: an agent's skills and its settings.

    ``skills`` maps names to callables (sync or ``async def``) taking a
    ``Session``; ``default_skill`` (default: the first) runs when a spawn names
    none; ``main_skill`` runs the agent's Main message cycles — one per inbound
    message and per child result. Without ``main_skill`` a skill named
    ``main`` runs them, or the agent's only skill; an agent with several
    skills and neither is refused with ``ValueError`` (its Main would run a
    skill written for its children).
    ``model_tiers`` go from cheapest to best: workers get the first, a Main the
    last. ``ttls`` overrides the default TTL per kind (None: no TTL).
    ``dm_scope`` maps direct messages to sessions (``Node.route``): ``main``
    (all share the agent's main session), ``per-channel-peer`` or
    ``per-account-channel-peer``; groups and channels always get their own.
    ``budget`` is the default budget of each of its sessions (a Main's holds
    per message cycle); a spawn's own budget replaces it, and either only
    narrows what the parent has left. ``models`` maps each of the
    ``model_tiers`` to the model name ``session.complete`` calls (all of
    them, or none for an agent that calls no model), on the node's provider
    named ``provider`` (default: the node's first). ``compaction`` says when
    a Branch's or Worker's context is summarised (``Compaction``; None: never).
    """

    agent_id: str
    skills: Mapping[str, Skill]
    default_skill: str | None = None
    main_skill: str | None = None
    max_children: int = 8
    model_tiers: tuple[str, ...] = ("small", "large")
    ttls: Mapping[SessionKind, float | None] = field(default_factory=dict)
    dm_scope: str = "main"
    budget: Budget | None = None
    models: Mapping[str, str] = field(default_factory=dict)
    provider: str | None = None
    compaction: Compaction | None = None
    _async_skills: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.agent_id or not isinstance(self.agent_id, str):
            msg = f"Agent.agent_id must be a non-empty string, got {self.agent_id!r}"
            raise ValueError(msg)
        if not self.skills:
            msg = f"agent {self.agent_id!r} needs at least one skill"
            raise ValueError(msg)
        for name, skill in self.skills.items():
            if not callable(skill):
                msg = f"agent {self.agent_id!r}: skill {name!r} is not callable"
                raise TypeError(msg)
        for chosen in (self.default_skill, self.main_skill):
            if chosen is not None and chosen not in self.skills:
                msg = f"agent {self.agent_id!r} has no skill {chosen!r}"
                raise ValueError(msg)
        if self.main_skill is None and MAIN_SKILL not in self.skills and len(self.skills) > 1:
            names = ", ".join(repr(name) for name in self.skills)
            msg = (
                f"agent {self.agent_id!r} has several skills ({names}) and no main_skill: "
                f"name the skill that runs its Main's message cycles (main_skill=...), "
                f"or call it {MAIN_SKILL!r}"
            )
            raise ValueError(msg)
        if self.compaction is not None and not isinstance(self.compaction, Compaction):
            msg = (
                f"agent {self.agent_id!r}: compaction must be a Compaction, got {self.compaction!r}"
            )
            raise TypeError(msg)
        if not isinstance(self.max_children, int) or self.max_children < 1:
            msg = f"agent {self.agent_id!r}: max_children must be >= 1, got {self.max_children!r}"
            raise ValueError(msg)
        for kind, ttl in self.ttls.items():
            if ttl is not None and (
                not isinstance(ttl, int | float) or not math.isfinite(ttl) or ttl <= 0
            ):
                msg = f"agent {self.agent_id!r}: ttls[{kind!r}] must be None or a finite number > 0"
                raise ValueError(msg)
        if self.dm_scope not in {s.value for s in DmScope}:
            choices = ", ".join(s.value for s in DmScope)
            msg = f"agent {self.agent_id!r}: dm_scope {self.dm_scope!r} must be one of {choices}"
            raise ValueError(msg)
        if self.budget is not None:
            try:  # checked as strictly as a spawn's
                msgspec.convert(msgspec.to_builtins(self.budget), Budget)
            except msgspec.ValidationError as exc:
                msg = f"agent {self.agent_id!r}: invalid budget: {exc}"
                raise ValueError(msg) from exc
        if not self.model_tiers:
            msg = f"agent {self.agent_id!r} needs at least one model tier"
            raise ValueError(msg)
        for tier in self.model_tiers if self.models else ():
            model = self.models.get(tier)
            if not isinstance(model, str) or not model:
                msg = f"agent {self.agent_id!r}: models[{tier!r}] must name a model"
                raise ValueError(msg)
        for tier in self.models:
            if tier not in self.model_tiers:
                msg = f"agent {self.agent_id!r}: models[{tier!r}] is not one of its model_tiers"
                raise ValueError(msg)
        if self.provider is not None and (not isinstance(self.provider, str) or not self.provider):
            msg = f"agent {self.agent_id!r}: provider must be None or a provider's name"
            raise ValueError(msg)
        # decided once here: inspecting a function's flags on every spawn cost more
        asyncs = frozenset(name for name, skill in self.skills.items() if is_async_skill(skill))
        object.__setattr__(self, "_async_skills", asyncs)

    def is_async(self, skill: str) -> bool:
        """Whether the skill called ``skill`` must be awaited (an ``async def``)."""
        return skill in self._async_skills

    @property
    def default(self) -> str:
        """The skill that runs when a spawn names none."""
        return self.default_skill or next(iter(self.skills))

    @property
    def main(self) -> str:
        """The skill that runs a Main's message cycles: ``main_skill``, else the
        skill named ``main``, else the only skill."""
        if self.main_skill is not None:
            return self.main_skill
        if MAIN_SKILL in self.skills:
            return MAIN_SKILL
        return next(iter(self.skills))

    def ttl_for(self, kind: SessionKind) -> float | None:
        """The default TTL of ``kind`` for this agent."""
        if kind in self.ttls:
            return self.ttls[kind]
        return _DEFAULT_TTLS[kind]
