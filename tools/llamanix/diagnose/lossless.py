"""Is speculation lossless? Two running servers, the same prompts, temperature 0, a fixed seed.

Speculative decoding is meant to be exact at temperature 0: the target verifies every drafted
token and keeps only what it would have produced itself. In practice batched verification runs
the target's kernels on a different batch shape than one-token decoding does, and floating-point
sums in another order can flip a near-tie between two tokens; from there on the text drifts. A
user saw prose drift by about a thousand characters while tool calls survived. This module
measures that: per prompt, whether the outputs are identical, the character-level edit distance
(median over the runs), where the first difference is, and for tool calls whether they still
match in structure (function names, argument keys, JSON shape) when they differ in values.

Each server is also compared with itself across runs: when a baseline does not repeat its own
output, a difference against it says nothing about speculation.

Raw-text prompts (a base model without a chat template) go to /completion. With
``concurrency`` above 1 that many prompts are in flight at once, so a server with as many slots
decodes them in one batch: the numerics of a batch of several sequences differ from one
sequence's, and this is how to see whether they change the text.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

import httpx
from rapidfuzz.distance import Levenshtein
from rich.console import JustifyMethod
from rich.markup import escape
from rich.table import Table

from llamanix import __version__
from llamanix.bench.bench import ProgressHook
from llamanix.bench.bench_results import DEFAULT_SEED
from llamanix.bench.prompts import Prompt
from llamanix.bench.streaming import is_raw
from llamanix.core import json_codec
from llamanix.core import json_fields as jf
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.core.json_codec import JsonRecord, JsonShape
from llamanix.core.json_value import JsonObject
from llamanix.server.client import LlamaClient, error_message

RESULT_FORMAT = "llamanix-lossless/1"
DEFAULT_RUNS = 3
DEFAULT_MAX_TOKENS = 512
Side = Literal["a", "b"]


@dataclass(frozen=True)
class LosslessSettings:
    url_a: str
    url_b: str
    max_tokens: int = DEFAULT_MAX_TOKENS
    runs: int = DEFAULT_RUNS
    seed: int = DEFAULT_SEED
    strict: bool = False  # every prompt must match, as if each said "must_match": true
    concurrency: int = 1  # prompts in flight at once per server


# --- tool calls: what must survive even when the prose drifts --------------------------------


@dataclass(frozen=True)
class ToolCall:
    """One call as the server parsed it; the call id is random per response and left out."""

    name: str
    arguments: str  # the JSON text the model wrote

    def parsed_arguments(self) -> tuple[bool, Any]:
        try:
            return True, json.loads(self.arguments)
        except ValueError:
            return False, None


def json_shape(value: Any) -> Any:
    """The structure of a JSON value without its values: object keys with their shapes, the
    set of shapes a list's elements have (its length is a value), and the type of a scalar."""
    if isinstance(value, dict):
        return {key: json_shape(v) for key, v in sorted(value.items())}
    if isinstance(value, list):
        shapes: list[Any] = []
        for item in value:
            shape = json_shape(item)
            if shape not in shapes:
                shapes.append(shape)
        return sorted(shapes, key=lambda s: json.dumps(s, sort_keys=True))
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"  # JSON has one number type: 1 and 1.0 are the same shape
    if isinstance(value, str):
        return "string"
    return "null"


def _shape_path(a: Any, b: Any, path: str) -> str | None:
    """Where two shapes first differ, as ``path: shape vs shape``; None when equal."""
    if a == b:
        return None
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        for key in a:
            found = _shape_path(a[key], b[key], f"{path}.{key}")
            if found:
                return found
    return f"{path}: {_short(a)} vs {_short(b)}"


def _short(shape: Any) -> str:
    if isinstance(shape, dict):
        return "object"
    if isinstance(shape, list):
        return "list of " + (" | ".join(_short(s) for s in shape) or "nothing")
    return str(shape)


@dataclass(frozen=True)
class ToolCallMatch:
    """Whether two responses' tool calls agree in structure; ``reason`` says where not."""

    match: bool
    reason: str | None = None


def compare_tool_calls(a: Sequence[ToolCall], b: Sequence[ToolCall]) -> ToolCallMatch:
    """Same number of calls, and call by call the same function, the same argument keys and the
    same JSON shape (types and nesting); argument values may differ."""
    if len(a) != len(b):
        return ToolCallMatch(False, f"{len(a)} call(s) vs {len(b)}")
    for i, (ca, cb) in enumerate(zip(a, b, strict=True), 1):
        if ca.name != cb.name:
            return ToolCallMatch(False, f"call {i}: function {ca.name} vs {cb.name}")
        ok_a, args_a = ca.parsed_arguments()
        ok_b, args_b = cb.parsed_arguments()
        if not (ok_a and ok_b):
            if ok_a == ok_b:
                continue  # neither is JSON: nothing structural to compare
            return ToolCallMatch(
                False,
                f"call {i} {ca.name}: arguments are "
                f"{'JSON' if ok_a else 'not JSON'} vs {'JSON' if ok_b else 'not JSON'}",
            )
        if isinstance(args_a, dict) and isinstance(args_b, dict) and args_a.keys() != args_b.keys():
            return ToolCallMatch(
                False,
                f"call {i} {ca.name}: argument keys {sorted(args_a)} vs {sorted(args_b)}",
            )
        where = _shape_path(json_shape(args_a), json_shape(args_b), "arguments")
        if where:
            return ToolCallMatch(False, f"call {i} {ca.name}: {where}")
    return ToolCallMatch(True)


# --- one answer ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """What one server answered: the text a user reads and the calls an agent runs."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    predicted_n: int | None
    draft_n: int | None
    draft_n_accepted: int | None

    def same_as(self, other: Answer) -> bool:
        return self.text == other.text and self.tool_calls == other.tool_calls


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_answer(data: Any, url: str) -> Answer:
    """A non-streamed /v1/chat/completions response. A reasoning model's thinking is part of
    what is compared: it is generated by the same decoding as the answer."""
    try:
        choice = data["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise ExternalCommandError(f"{url}: not a chat completion: {str(data)[:200]}") from None
    text = (message.get("reasoning_content") or "") + (message.get("content") or "")
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        calls.append(
            ToolCall(
                name=str(function.get("name")),
                arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
            )
        )
    return _answer(data, text, tuple(calls), choice.get("finish_reason"))


def parse_text_answer(data: Any, url: str) -> Answer:
    """A non-streamed /completion response (raw text in, raw text out)."""
    if not isinstance(data, dict) or not isinstance(data.get("content"), str):
        raise ExternalCommandError(f"{url}: not a completion: {str(data)[:200]}")
    stop = data.get("stop_type")
    return _answer(data, data["content"], (), str(stop) if stop else None)


def _answer(
    data: Mapping[str, object], text: str, calls: tuple[ToolCall, ...], finish: str | None
) -> Answer:
    """The answer with the token and draft counts of the response's ``timings``."""
    timings = jf.table(data.get("timings"))
    return Answer(
        text=text,
        tool_calls=calls,
        finish_reason=finish,
        predicted_n=_int(timings.get("predicted_n")),
        draft_n=_int(timings.get("draft_n")),
        draft_n_accepted=_int(timings.get("draft_n_accepted")),
    )


def request_body(prompt: Prompt, settings: LosslessSettings) -> JsonObject:
    body: JsonObject = {
        "temperature": 0,
        "seed": settings.seed,
        # A cached prefix changes the batches the prompt is processed in, and with them the
        # rounding: both servers start every request cold so only the server differs.
        "cache_prompt": False,
    }
    if prompt.text is not None:
        return {
            **body,
            "prompt": prompt.text,
            "n_predict": prompt.max_tokens or settings.max_tokens,
        }
    body["messages"] = [*prompt.messages]
    body["max_tokens"] = prompt.max_tokens or settings.max_tokens
    if prompt.tools:
        body["tools"] = [*prompt.tools]
    return body


def ask(client: LlamaClient, body: JsonObject) -> Answer:
    url = client.url
    raw = is_raw(body)
    try:
        resp = client.complete_body(body) if raw else client.chat(body)
    except httpx.TransportError as err:
        raise ExternalCommandError(f"{url}: request failed ({err.__class__.__name__})") from None
    if resp.status_code in (401, 403):
        raise UserError(Problem(url, "request", f"HTTP {resp.status_code}", "pass --api-key-file"))
    if resp.status_code == 400:
        # The server refused the request as written: a prompt's messages or tools (llama-server
        # takes tools only with --jinja and a chat template that knows them).
        raise UserError(
            Problem(
                url,
                "--prompts",
                f"HTTP 400: {error_message(resp.text)[:300]}",
                "check the prompts; tools need a server started with --jinja",
            )
        )
    if resp.status_code != 200:
        raise ExternalCommandError(
            f"{url}: HTTP {resp.status_code}: {error_message(resp.text)[:300]}"
        )
    try:
        data = resp.json()
    except ValueError:
        raise ExternalCommandError(f"{url}: the answer is not JSON") from None
    return parse_text_answer(data, url) if raw else parse_answer(data, url)


def check_reachable(client: LlamaClient, argument: str) -> None:
    """One line naming the URL and the argument when nothing healthy answers there."""
    try:
        resp = client.health()
    except httpx.TransportError as err:
        raise UserError(
            Problem(
                client.url,
                argument,
                f"cannot connect ({err.__class__.__name__})",
                f"start the server or fix {argument}",
            )
        ) from None
    if resp.status_code in (401, 403):
        raise UserError(
            Problem(
                client.url,
                argument,
                f"HTTP {resp.status_code} from /health",
                "pass --api-key-file with the server's key",
            )
        )
    if resp.status_code != 200:
        raise UserError(
            Problem(
                client.url,
                argument,
                f"not ready (/health answered HTTP {resp.status_code})",
                "wait until the model is loaded",
            )
        )


# --- the comparison ----------------------------------------------------------------------


def first_difference(a: str, b: str) -> int | None:
    """The index of the first character where two texts differ; None when equal."""
    if a == b:
        return None
    for i, (ca, cb) in enumerate(zip(a, b, strict=False)):
        if ca != cb:
            return i
    return min(len(a), len(b))


@dataclass(frozen=True)
class RunComparison:
    run: int
    identical: bool
    edit_distance: int
    first_difference: int | None
    tool_calls: ToolCallMatch | None  # None: neither side called a tool
    a: Answer
    b: Answer


def compare_answers(run: int, a: Answer, b: Answer) -> RunComparison:
    calls = compare_tool_calls(a.tool_calls, b.tool_calls) if a.tool_calls or b.tool_calls else None
    return RunComparison(
        run=run,
        identical=a.same_as(b),
        edit_distance=Levenshtein.distance(a.text, b.text),
        first_difference=first_difference(a.text, b.text),
        tool_calls=calls,
        a=a,
        b=b,
    )


@dataclass
class PromptComparison:
    """One prompt over all runs."""

    name: str
    must_match: bool
    runs: list[RunComparison] = field(default_factory=list)
    workload: str | None = None  # the prompt's workload (edit, prose...), if it names one

    @property
    def identical(self) -> bool:
        return all(r.identical for r in self.runs)

    @property
    def identical_runs(self) -> int:
        return sum(r.identical for r in self.runs)

    @property
    def edit_distance_median(self) -> float:
        return statistics.median(r.edit_distance for r in self.runs)

    @property
    def edit_distance_max(self) -> int:
        return max(r.edit_distance for r in self.runs)

    @property
    def first_difference(self) -> int | None:
        found = [r.first_difference for r in self.runs if r.first_difference is not None]
        return min(found) if found else None

    @property
    def tool_calls(self) -> ToolCallMatch | None:
        """Structural agreement over every run; the first disagreement's reason."""
        seen = [r.tool_calls for r in self.runs if r.tool_calls is not None]
        if not seen:
            return None
        return next((m for m in seen if not m.match), seen[0])

    def stable(self, side: Side) -> bool:
        """Whether this server repeated its own answer in every run."""
        answers = [r.a if side == "a" else r.b for r in self.runs]
        return all(x.same_as(answers[0]) for x in answers[1:])

    @property
    def failed(self) -> bool:
        return self.must_match and not self.identical

    def chars(self, side: Side) -> float:
        return statistics.median(len((r.a if side == "a" else r.b).text) for r in self.runs)

    def drafted(self, side: Side) -> int | None:
        """Tokens drafted over all runs; None when the server reported no speculation."""
        values = [(r.a if side == "a" else r.b).draft_n for r in self.runs]
        known = [v for v in values if v is not None]
        return sum(known) if known else None

    # Hand-written: its figures (counts, medians, per side) follow from the runs.
    def to_json(self) -> JsonObject:
        calls = self.tool_calls
        return {
            "name": self.name,
            "workload": self.workload,
            "must_match": self.must_match,
            "identical": self.identical,
            "identical_runs": self.identical_runs,
            "runs_n": len(self.runs),
            "edit_distance": {"median": self.edit_distance_median, "max": self.edit_distance_max},
            "first_difference": self.first_difference,
            "chars": {"a": self.chars("a"), "b": self.chars("b")},
            "tool_calls": json_codec.to_json(calls) if calls is not None else None,
            "stable": {"a": self.stable("a"), "b": self.stable("b")},
            "draft_n": {"a": self.drafted("a"), "b": self.drafted("b")},
            "failed": self.failed,
            "runs": [json_codec.to_json(r) for r in self.runs],
        }


@dataclass(frozen=True)
class WorkloadSummary(JsonRecord):
    """How many of a workload's prompts came out identical, and how far the others drifted."""

    workload: str
    prompts: int
    identical: int
    edit_distances: tuple[float, ...]  # median per differing prompt
    first_differences: tuple[int, ...]  # first differing character per differing prompt

    def sentence(self) -> str:
        text = f"{self.workload}: {self.identical} of {self.prompts} identical"
        if self.edit_distances:
            dist = ", ".join(f"{d:g}" for d in self.edit_distances)
            first = ", ".join(str(i) for i in self.first_differences)
            text += f"; edit distance {dist}; first difference at character {first}"
        return text


def summarise_workloads(prompts: Sequence[PromptComparison]) -> list[WorkloadSummary]:
    """Per workload (a prompt without one counts as "all"), in the order they first appear."""
    names = list(dict.fromkeys(p.workload or "all" for p in prompts))
    out = []
    for name in names:
        mine = [p for p in prompts if (p.workload or "all") == name]
        differ = [p for p in mine if not p.identical]
        out.append(
            WorkloadSummary(
                workload=name,
                prompts=len(mine),
                identical=len(mine) - len(differ),
                edit_distances=tuple(p.edit_distance_median for p in differ),
                first_differences=tuple(
                    p.first_difference for p in differ if p.first_difference is not None
                ),
            )
        )
    return out


@dataclass
class LosslessResult(JsonRecord):
    """What ``lossless --json`` writes: its format and the version first, then each workload's
    own shape and the figures that follow from them."""

    settings: LosslessSettings
    workloads: list[PromptComparison]
    date: str

    json_shape: ClassVar[JsonShape] = JsonShape(
        constants={"format": RESULT_FORMAT, "llamanix": __version__},
        computed={"failed": lambda r: r.failed, "by_workload": lambda r: r.by_workload},
        order=("format", "llamanix", "date", "settings", "failed", "by_workload", "workloads"),
    )

    @property
    def failed(self) -> list[str]:
        return [w.name for w in self.workloads if w.failed]

    @property
    def by_workload(self) -> list[WorkloadSummary]:
        return summarise_workloads(self.workloads)


def planned_steps(settings: LosslessSettings, prompts: Sequence[Prompt]) -> int:
    """How many progress steps run_lossless reports: one request per server, prompt and run."""
    return 2 * settings.runs * len(prompts)


def collect_answers(
    client: LlamaClient,
    prompts: Sequence[Prompt],
    settings: LosslessSettings,
    progress: ProgressHook | None = None,
    label: str = "",
) -> list[Answer]:
    """Every prompt's answer from one server, in prompt order, ``settings.concurrency`` at a
    time (one at a time by default: a second request in flight shares the batch)."""

    def one(prompt: Prompt) -> Answer:
        answer = ask(client, request_body(prompt, settings))
        if progress:
            progress(f"{prompt.name} {label}".rstrip())
        return answer

    if settings.concurrency <= 1:
        return [one(p) for p in prompts]
    with ThreadPoolExecutor(max_workers=settings.concurrency) as pool:
        return list(pool.map(one, prompts))


def compare_runs(
    prompts: Sequence[Prompt],
    runs: Sequence[tuple[Sequence[Answer], Sequence[Answer]]],
    strict: bool = False,
) -> list[PromptComparison]:
    """Per prompt, each run's answer from A against B's."""
    out = []
    for i, prompt in enumerate(prompts):
        compared = PromptComparison(
            prompt.name, must_match=prompt.must_match or strict, workload=prompt.workload
        )
        for run, (a, b) in enumerate(runs, 1):
            compared.runs.append(compare_answers(run, a[i], b[i]))
        out.append(compared)
    return out


def run_lossless(
    settings: LosslessSettings,
    prompts: Sequence[Prompt],
    *,
    api_key: str | None = None,
    progress: ProgressHook | None = None,
) -> LosslessResult:
    """Ask both servers every prompt ``settings.runs`` times."""
    with (
        LlamaClient(settings.url_a, api_key=api_key) as client_a,
        LlamaClient(settings.url_b, api_key=api_key) as client_b,
    ):
        check_reachable(client_a, "URL_A")
        check_reachable(client_b, "URL_B")
        runs = []
        for run in range(1, settings.runs + 1):
            label = f"{run}/{settings.runs}"
            a = collect_answers(client_a, prompts, settings, progress, f"A {label}")
            b = collect_answers(client_b, prompts, settings, progress, f"B {label}")
            runs.append((a, b))
    return LosslessResult(
        settings=settings,
        workloads=compare_runs(prompts, runs, settings.strict),
        date=datetime.now(UTC).isoformat(timespec="seconds"),
    )


# --- the table ----------------------------------------------------------------------------


def _yes_no(ok: bool, good: str = "yes", bad: str = "no") -> str:
    return f"[green]{good}[/]" if ok else f"[bold red]{bad}[/]"


def summary_table(result: LosslessResult) -> Table:
    s = result.settings
    slots = f", {s.concurrency} in flight" if s.concurrency > 1 else ""
    table = Table(
        title=f"A {escape(s.url_a)}  vs  B {escape(s.url_b)}  (temperature 0, seed {s.seed}, "
        f"{s.runs} run(s){slots})",
        title_justify="left",
        caption=escape("; ".join(w.sentence() for w in result.by_workload)),
        caption_justify="left",
    )
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("workload", "left"),
        ("must match", "left"),
        ("identical", "left"),
        ("edit distance", "right"),
        ("first diff at", "right"),
        ("chars A / B", "right"),
        ("tool calls", "left"),
        ("A / B repeat", "left"),
        ("drafted A / B", "right"),
    )
    for heading, justify in columns:
        table.add_column(heading, justify=justify)
    for w in result.workloads:
        n = len(w.runs)
        identical = (
            _yes_no(w.identical)
            if n == 1
            else (_yes_no(w.identical, f"yes ({n}/{n})", f"no ({w.identical_runs}/{n})"))
        )
        calls = w.tool_calls
        if calls is None:
            calls_text = "-"
        elif calls.match:
            calls_text = "[green]same structure[/]"
        else:
            calls_text = f"[bold red]{escape(calls.reason or 'differ')}[/]"
        dist = f"{w.edit_distance_median:g}" + (
            f" (max {w.edit_distance_max})" if w.edit_distance_max != w.edit_distance_median else ""
        )
        repeat = " / ".join("yes" if w.stable(side) else "[yellow]no[/]" for side in ("a", "b"))
        drafted = " / ".join(
            "-" if (d := w.drafted(side)) is None else str(d) for side in ("a", "b")
        )
        table.add_row(
            escape(w.name),
            "yes" if w.must_match else "no",
            identical,
            dist,
            "-" if w.first_difference is None else str(w.first_difference),
            f"{w.chars('a'):g} / {w.chars('b'):g}",
            calls_text,
            repeat,
            drafted,
        )
    return table
