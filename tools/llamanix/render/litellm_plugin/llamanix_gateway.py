"""llamanix's plugin for the gateway's LiteLLM: conversation affinity, and health checks that
cost the replicas nothing (docs/gateway.md).

LiteLLM loads it as a callback (``litellm_settings.callbacks: ["llamanix_gateway.handler"]``):
the llamanix gateway unit puts this file's directory on LiteLLM's ``PYTHONPATH`` (``llamanix
gateway-exec``), the NixOS module does the same for nixpkgs' ``services.litellm``. It runs inside
LiteLLM's interpreter, so it imports nothing of llamanix, only the standard library and
LiteLLM. Its settings come from LiteLLM's own config (``environment_variables``, which the
proxy puts into the environment before it loads callbacks), as JSON in ``LLAMANIX_GATEWAY``.

**Affinity.** A conversation's turns go to the replica that served it last: that replica holds
the conversation in a slot (or in llama-server's prompt cache in RAM) and prefills only the new
turn; any other replica prefills all of it. A conversation is known by the ``X-Session-Id``
header when the client sends one, else by a hash of its start: the system messages and the first
``PREFIX_CHARS`` characters of its first user message (of the prompt, for ``/v1/completions``).
Two conversations that start alike share a replica, which is where their common prefix is
cached. LiteLLM's deployment filter (``async_filter_deployments``) narrows the model group to
that one replica while it is healthy, not draining and not overloaded; a new conversation gets
the least loaded replica (requests in flight per slot, then fewest conversations), so a full
replica spills over. Conversations are remembered in a bounded LRU: losing it (a restart) costs
one cold turn each.

**Health.** LiteLLM's own background health checks send a completion to every replica (through
a router or llama-swap: to every member, which loads it). Here each replica's ``/health`` is
asked instead, every ``interval`` seconds: llama-server answers it without a slot, and a router
or llama-swap answers for itself, loading no member. A replica that does not answer 200 is left
out until it does; a request that failed on a replica for the replica's own reasons (no
connection, an HTTP status of 500 or more) leaves it out until a check started after that
failure passes. When every replica is left out, the filter leaves LiteLLM the whole group, so a
request fails with the replicas' own error rather than one of this plugin's making.

**Routes.** During a rolling switch the controller writes ``routes`` (a JSON file in the
gateway's state directory): replicas that are draining (no new conversations), and moves (every
conversation of a drained replica now lives on the replica its caches were restored on). Each
file has a ``seq``; the plugin applies a file once and answers with ``routes-applied.json``
beside it, naming the ``seq`` it applied, which the controller waits for.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

try:
    from litellm.integrations.custom_logger import CustomLogger

    IN_LITELLM = True
except ImportError:  # llamanix's own tests run the logic without LiteLLM
    CustomLogger = object
    IN_LITELLM = False

SETTINGS_ENV = "LLAMANIX_GATEWAY"


def say(line: str) -> None:
    """One line of the plugin's own into LiteLLM's output (the unit's journal)."""
    print(f"llamanix gateway: {line}", file=sys.stderr, flush=True)


SESSION_HEADER = "x-session-id"
# How much of the first user message names a conversation: enough to tell conversations apart,
# and the same while the prompt of a raw completion grows turn by turn.
PREFIX_CHARS = 2048
# A conversation leaves its replica when that replica has this many requests in flight per slot
# (every slot busy and as many waiting) and another replica has a slot free: waiting behind a
# full queue costs more than the prefill elsewhere.
OVERLOAD = 2
# A request older than this is taken for ended (its end was not logged): LiteLLM's own timeout.
STALE_S = 900.0
HEALTH_TIMEOUT_S = 2.0
# A server busy with prefill on a loaded host answers its /health late; one that is down
# refuses the connection or answers 503 at once. Only this many late answers in a row make a
# replica unhealthy: one late answer would move every conversation it holds, cold.
LATE_CHECKS = 3
# What a check that got no answer in time returns as its status.
LATE = -1
ROUTES_TICK_S = 0.2
ROUTES_APPLIED = "routes-applied.json"
Clock = Callable[[], float]


class SettingsError(ValueError):
    """The plugin's settings are missing or malformed: LiteLLM does not start."""


@dataclass(frozen=True)
class Settings:
    """What the render gives the plugin (render/gateway.py's ``plugin_settings``)."""

    interval_s: float
    routes: str | None
    conversations: int
    # Each model group: whether its conversations keep their replica.
    affinity: Mapping[str, bool]
    # Each replica (its deployment id, the instance's name): the URL of its /health.
    health: Mapping[str, str]

    @staticmethod
    def parse(text: str | None) -> Settings:
        if not text:
            raise SettingsError(f"{SETTINGS_ENV} is not set (LiteLLM's environment_variables)")
        try:
            data = json.loads(text)
        except ValueError as err:
            raise SettingsError(f"{SETTINGS_ENV}: not JSON: {err}") from None
        if not isinstance(data, dict) or data.get("version") != 1:
            raise SettingsError(f"{SETTINGS_ENV}: not version 1 of llamanix's gateway settings")
        interval, routes, conversations = (
            data.get("interval"),
            data.get("routes"),
            data.get("conversations"),
        )
        affinity, health = data.get("affinity"), data.get("health")
        if not isinstance(interval, int | float) or isinstance(interval, bool) or interval <= 0:
            raise SettingsError(f"{SETTINGS_ENV}: interval: a number of seconds above 0")
        if routes is not None and not (isinstance(routes, str) and routes.startswith("/")):
            raise SettingsError(f"{SETTINGS_ENV}: routes: an absolute path, or null")
        if not isinstance(conversations, int) or isinstance(conversations, bool):
            raise SettingsError(f"{SETTINGS_ENV}: conversations: a whole number")
        if conversations < 1:
            raise SettingsError(f"{SETTINGS_ENV}: conversations: 1 or more")
        if not isinstance(affinity, dict) or not all(
            isinstance(k, str) and isinstance(v, bool) for k, v in affinity.items()
        ):
            raise SettingsError(f"{SETTINGS_ENV}: affinity: each model group's true or false")
        if not isinstance(health, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in health.items()
        ):
            raise SettingsError(f"{SETTINGS_ENV}: health: each replica's /health URL")
        return Settings(float(interval), routes, conversations, affinity, health)


# --- which conversation a request belongs to --------------------------------------------------


def _text(content: object) -> str:
    """A message's content as text: a string, or the text of its parts (other parts as JSON)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(json.dumps(part, sort_keys=True, default=str))
        return "".join(parts)
    return json.dumps(content, sort_keys=True, default=str)


def conversation_key(messages: object, headers: Mapping[str, object] | None) -> str | None:
    """The conversation a request continues: its session header, else its start (the system
    messages and the first ``PREFIX_CHARS`` of the first user message); None when it has
    neither (no user message)."""
    for name, value in (headers or {}).items():
        if name.lower() == SESSION_HEADER and isinstance(value, str) and value.strip():
            return "session:" + hashlib.sha256(value.strip().encode()).hexdigest()[:32]
    if not isinstance(messages, list):
        return None
    system: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role, content = message.get("role"), message.get("content")
        if role == "user":
            start = json.dumps([system, _text(content)[:PREFIX_CHARS]], ensure_ascii=False)
            return "prefix:" + hashlib.sha256(start.encode()).hexdigest()[:32]
        if role in ("system", "developer"):
            system.append(_text(content))
    return None


# --- the routing state ------------------------------------------------------------------------


@dataclass
class Replica:
    # Unknown counts as healthy: the first check comes within one interval.
    healthy: bool = True
    # When a request failed there for the replica's own reasons (None: none since it last
    # passed a check started after it).
    failed_at: float | None = None
    # Its slots (llama-server's /props total_slots); None where it does not say (a router).
    slots: int | None = None
    # Checks in a row that got no answer within HEALTH_TIMEOUT_S.
    late: int = 0
    # Requests in flight there: LiteLLM's call id -> when it was sent.
    calls: dict[str, float] = field(default_factory=dict)
    conversations: int = 0


Conversation = tuple[str, str]  # (model group, key)


class Router:
    """Where each conversation lives, what each replica has in flight, and which replicas
    are usable: the decisions of the filter, without LiteLLM (so llamanix's tests run them)."""

    def __init__(self, settings: Settings, clock: Clock = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self.lock = threading.Lock()
        self.replicas: dict[str, Replica] = {name: Replica() for name in settings.health}
        self.conversations: OrderedDict[Conversation, str] = OrderedDict()
        self.draining: frozenset[str] = frozenset()
        self.seq: object = None
        self._call_replica: dict[str, str] = {}

    def _replica(self, name: str) -> Replica:
        found = self.replicas.get(name)
        if found is None:
            found = self.replicas[name] = Replica()
        return found

    # --- what the filter decides ---

    def choose(self, group: str, key: str | None, candidates: Sequence[str]) -> list[str]:
        """The replicas of ``group`` a request may go to, of ``candidates`` (LiteLLM's list,
        by deployment id)."""
        with self.lock:
            usable = [c for c in candidates if self._usable(c)]
            if not usable:
                return list(candidates)
            if not self.settings.affinity.get(group, False):
                return usable
            fresh = [c for c in usable if c not in self.draining] or usable
            home = None if key is None else self.conversations.get((group, key))
            why = None if home is None else self._left(home, candidates, fresh)
            if key is not None and home is not None and why is None:
                self.conversations.move_to_end((group, key))
                return [home]
            chosen = min(fresh, key=self._load)
            if key is not None:
                self._remember((group, key), chosen)
            if why is not None and chosen != home:
                # Each such turn is one full prefill: say why (never which conversation: its
                # key may be a client's session header).
                say(f"a conversation of {group} moved from {home} to {chosen}: {why}")
            return [chosen]

    def _left(self, home: str, candidates: Sequence[str], fresh: Sequence[str]) -> str | None:
        """Why a conversation leaves ``home``, its replica; None while it stays."""
        replica = self._replica(home)
        if home not in candidates:
            return "LiteLLM left it out (its cooldown, or no longer in the group)"
        if not replica.healthy:
            return "it fails its health checks"
        if replica.failed_at is not None:
            return "a request failed there and no check has passed since"
        if self._overloaded(home, fresh):
            return f"{len(replica.calls)} requests in flight for its {replica.slots} slots"
        return None

    def _usable(self, name: str) -> bool:
        replica = self._replica(name)
        return replica.healthy and replica.failed_at is None

    def _busy(self, name: str) -> float:
        replica = self._replica(name)
        return len(replica.calls) / (replica.slots or 1)

    def _load(self, name: str) -> tuple[float, int, int, str]:
        replica = self._replica(name)
        return (self._busy(name), len(replica.calls), replica.conversations, name)

    def _overloaded(self, name: str, others: Sequence[str]) -> bool:
        if self._replica(name).slots is None or self._busy(name) < OVERLOAD:
            return False
        return any(self._busy(o) < 1 for o in others if o != name)

    def _remember(self, conversation: Conversation, name: str) -> None:
        old = self.conversations.get(conversation)
        if old != name:
            if old is not None:
                self._replica(old).conversations -= 1
            self._replica(name).conversations += 1
        self.conversations[conversation] = name
        self.conversations.move_to_end(conversation)
        while len(self.conversations) > self.settings.conversations:
            _, evicted = self.conversations.popitem(last=False)
            self._replica(evicted).conversations -= 1

    def home(self, group: str, key: str) -> str | None:
        with self.lock:
            return self.conversations.get((group, key))

    # --- what LiteLLM's hooks report ---

    def started(self, call: str, name: str, conversation: Conversation | None) -> None:
        """A request was sent to ``name`` (a conversation's turn: it lives there now)."""
        now = self.clock()
        with self.lock:
            self._end(call)
            self._replica(name).calls[call] = now
            self._call_replica[call] = name
            if conversation is not None:
                self._remember(conversation, name)
            for replica in self.replicas.values():
                for old in [c for c, t in replica.calls.items() if now - t > STALE_S]:
                    del replica.calls[old]
                    self._call_replica.pop(old, None)

    def ended(self, call: str) -> None:
        with self.lock:
            self._end(call)

    def _end(self, call: str) -> None:
        name = self._call_replica.pop(call, None)
        if name is not None:
            self._replica(name).calls.pop(call, None)

    def failed(self, name: str) -> None:
        """A request failed on ``name`` for the replica's own reasons."""
        now = self.clock()
        with self.lock:
            self._replica(name).failed_at = now

    def checked(
        self, name: str, ok: bool, started: float, slots: int | None = None, late: bool = False
    ) -> None:
        """A health check of ``name``, sent at ``started``, passed (``ok``) or not; ``late``:
        it got no answer in time (unhealthy only after ``LATE_CHECKS`` such checks in a
        row)."""
        with self.lock:
            replica = self._replica(name)
            replica.late = replica.late + 1 if late else 0
            was = replica.healthy
            # A late answer keeps what the last answer said, up to LATE_CHECKS in a row.
            replica.healthy = (was and replica.late < LATE_CHECKS) if late else ok
            if was != replica.healthy:
                state = "passes its health checks again" if replica.healthy else "is unhealthy"
                say(f"replica {name} {state}")
            if ok and replica.failed_at is not None and started > replica.failed_at:
                replica.failed_at = None
            if slots is not None:
                replica.slots = slots

    def apply_routes(self, data: object) -> object:
        """A routes file's content: its ``seq`` once applied (again: nothing changes)."""
        if not isinstance(data, dict) or "seq" not in data:
            return None
        with self.lock:
            if data["seq"] == self.seq:
                return self.seq
            draining = data.get("draining")
            self.draining = frozenset(
                d for d in (draining if isinstance(draining, list) else []) if isinstance(d, str)
            )
            moves = data.get("moves")
            for source, target in (moves if isinstance(moves, dict) else {}).items():
                if not isinstance(target, str):
                    continue
                for conversation, name in list(self.conversations.items()):
                    if name == source:
                        self._replica(source).conversations -= 1
                        self._replica(target).conversations += 1
                        self.conversations[conversation] = target
            self.seq = data["seq"]
            return self.seq


# --- the checks that run beside LiteLLM -------------------------------------------------------


def _get_json(url: str, timeout_s: float) -> tuple[int, object]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = resp.read(1 << 20)
            status = int(resp.status)
    except urllib.error.HTTPError as err:
        return err.code, None
    except TimeoutError:
        return LATE, None
    except urllib.error.URLError as err:
        return (LATE if isinstance(err.reason, TimeoutError) else 0), None
    except (OSError, ValueError):
        return 0, None
    try:
        return status, json.loads(body)
    except ValueError:
        return status, None


def props_url(health_url: str) -> str:
    return health_url.rsplit("/health", 1)[0] + "/props"


def watch_health(router: Router, name: str, url: str, stop: threading.Event) -> None:
    """Ask ``url`` every interval; the first time it passes, ask the server's /props for its
    slots (a GET, which takes no slot either)."""
    interval = router.settings.interval_s
    timeout = min(HEALTH_TIMEOUT_S, interval)
    slots_known = False
    while not stop.is_set():
        started = router.clock()
        status, _ = _get_json(url, timeout)
        slots = None
        if status == 200 and not slots_known:
            answer, props = _get_json(props_url(url), timeout)
            total = props.get("total_slots") if isinstance(props, dict) else None
            slots = total if isinstance(total, int) and total > 0 else None
            # Asked once an answer came (a router or llama-swap has no total_slots to give);
            # without its slots a full replica does not spill over, which is said.
            slots_known = answer not in (0, LATE)
            if slots_known and slots is None:
                say(
                    f"replica {name} does not say its slots (/props answered {answer}): "
                    "its conversations stay on it however many wait there"
                )
        router.checked(name, status == 200, started, slots, late=status == LATE)
        stop.wait(max(0.0, interval - (router.clock() - started)))


def _write_json(path: Path, data: object) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def watch_routes(router: Router, path: Path, stop: threading.Event) -> None:
    """Apply the routes file whenever it changes, and say which ``seq`` was applied."""
    seen: tuple[int, int] | None = None
    while not stop.is_set():
        try:
            st = path.stat()
            now = (st.st_mtime_ns, st.st_size)
            if now != seen:
                seen = now
                applied = router.apply_routes(json.loads(path.read_text()))
                if applied is not None:
                    _write_json(path.parent / ROUTES_APPLIED, {"seq": applied})
        except (OSError, ValueError):
            pass  # not written yet, or being replaced: the next tick reads it
        stop.wait(ROUTES_TICK_S)


def start_watching(router: Router) -> threading.Event:
    stop = threading.Event()
    for name, url in router.settings.health.items():
        threading.Thread(
            target=watch_health, args=(router, name, url, stop), daemon=True, name=f"health {name}"
        ).start()
    if router.settings.routes:
        threading.Thread(
            target=watch_routes,
            args=(router, Path(router.settings.routes), stop),
            daemon=True,
            name="routes",
        ).start()
    return stop


# --- LiteLLM's hooks --------------------------------------------------------------------------


def _dict(value: object) -> Mapping[str, object]:
    return value if isinstance(value, dict) else {}


def _deployment_id(deployment: object) -> str | None:
    value = _dict(_dict(deployment).get("model_info")).get("id")
    return None if value is None else str(value)


def _call_of(kwargs: Mapping[str, object]) -> tuple[str | None, str | None, Conversation | None]:
    """(call id, deployment id, conversation) of one request's kwargs, as LiteLLM's logging
    hooks and its failure hook hand them over."""
    call = kwargs.get("litellm_call_id")
    params = _dict(kwargs.get("litellm_params"))
    metadata = _dict(params.get("metadata")) or _dict(kwargs.get("metadata"))
    name = _deployment_id(params) or _deployment_id(metadata) or _deployment_id(kwargs)
    conversation = metadata.get(CONVERSATION)
    conv = (
        (conversation[0], conversation[1])
        if isinstance(conversation, list | tuple)
        and len(conversation) == 2
        and all(isinstance(c, str) for c in conversation)
        and _KEY.fullmatch(conversation[1])
        else None
    )
    return (str(call) if call is not None else None), name, conv


# Where the filter leaves the request's conversation for the hooks that see where it went.
CONVERSATION = "llamanix_conversation"
# The shape of a key ``conversation_key`` makes (a client's metadata cannot smuggle another).
_KEY = re.compile(r"(session|prefix):[0-9a-f]{32}")


def _replica_fault(exception: object) -> bool:
    """Whether a failure says something about the replica (no connection, a timeout, an HTTP
    status of 500 or more), not about the request (a 4xx)."""
    status = getattr(exception, "status_code", None)
    return not isinstance(status, int) or status >= 500


class Handler(CustomLogger):  # type: ignore[misc]
    """The callback LiteLLM loads: its deployment filter and logging hooks, on a ``Router``."""

    def __init__(self, router: Router) -> None:
        super().__init__()
        self.router = router

    async def async_filter_deployments(
        self,
        model: str,
        healthy_deployments: list[object],
        messages: object,
        request_kwargs: dict[str, object] | None = None,
        parent_otel_span: object = None,
    ) -> list[object]:
        kwargs = request_kwargs if request_kwargs is not None else {}
        for where in ("metadata", "litellm_metadata"):
            # Only this filter says which conversation a request continues: a client's own
            # metadata could otherwise move another's conversation, or fill the memory.
            client_metadata = kwargs.get(where)
            if isinstance(client_metadata, dict):
                client_metadata.pop(CONVERSATION, None)
        by_id = {_deployment_id(d): d for d in healthy_deployments}
        if None in by_id or not by_id:
            return healthy_deployments
        request_metadata = kwargs.get("metadata")
        metadata = (
            request_metadata
            if isinstance(request_metadata, dict)
            else _dict(kwargs.get("litellm_metadata"))
        )
        key = conversation_key(messages, _dict(metadata.get("headers")))
        group = model
        chosen = self.router.choose(group, key, [str(i) for i in by_id])
        if key is not None and isinstance(request_metadata, dict):
            request_metadata[CONVERSATION] = [group, key]
        return [by_id[name] for name in chosen]

    def log_pre_api_call(
        self, model: object, messages: object, kwargs: Mapping[str, object]
    ) -> None:
        call, name, conversation = _call_of(kwargs)
        if call is not None and name is not None:
            self.router.started(call, name, conversation)

    def _ended(self, kwargs: Mapping[str, object]) -> None:
        call, _, _ = _call_of(kwargs)
        if call is not None:
            self.router.ended(call)

    def log_success_event(
        self, kwargs: object, response_obj: object, start_time: object, end_time: object
    ) -> None:
        self._ended(_dict(kwargs))

    async def async_log_success_event(
        self, kwargs: object, response_obj: object, start_time: object, end_time: object
    ) -> None:
        self._ended(_dict(kwargs))

    def log_failure_event(
        self, kwargs: object, response_obj: object, start_time: object, end_time: object
    ) -> None:
        self._ended(_dict(kwargs))

    async def async_log_failure_event(
        self, kwargs: object, response_obj: object, start_time: object, end_time: object
    ) -> None:
        self._ended(_dict(kwargs))

    async def async_post_call_failure_deployment_hook(
        self,
        request_data: Mapping[str, object],
        exception: Exception,
        call_type: object,
        fallback_depth: int | None = None,
    ) -> None:
        """One attempt failed (LiteLLM retries next): leave its replica out until it passes
        a check, so that the retry goes elsewhere."""
        call, name, _ = _call_of(request_data)
        if call is not None:
            self.router.ended(call)
        if name is not None and _replica_fault(exception):
            self.router.failed(name)


def from_environment() -> Handler:
    router = Router(Settings.parse(os.environ.get(SETTINGS_ENV)))
    start_watching(router)
    return Handler(router)


# LiteLLM imports this module to load the callback, which must have its settings (else LiteLLM
# does not start, saying why); llamanix's own tests import it without LiteLLM.
handler: Handler | None = from_environment() if IN_LITELLM else None
