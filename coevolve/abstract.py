"""Abstraction: exploration episodes -> candidate tasks (CoEvolve, arXiv 2604.15840, §3 "task abstraction").

The paper groups the explorer's (action, observation) pairs per episode and has an LLM abstract them into
task-level specifications: an intent, a user query and a solution. A candidate here is exactly that, plus the
initial state it starts from — always the flagged task's initial state, where the explorer started (an LLM never
writes the state: it is untrusted output and could be anything).

Two abstractors:
- `TemplateAbstractor` (the offline default; no LLM). From an episode's successful calls it takes every window
  of consecutive calls (1 to `max_solution_calls` long) as a solution, shortest first, and writes the query from
  the tools' own documentation and the arguments ("Change the current working directory to the specified folder,
  with folder 'photos'. Then display the contents of a file..."). The queries are mechanical, not natural
  language; windows that only make sense after an earlier call (a file inside a folder entered before) are
  proposed anyway and fail validation, which is where the reported acceptance rate comes from.
  An episode with a focus tool (exploration from an unexplored tool, `ExplorationEpisode.focus`) is abstracted
  into the solutions that end in a successful call of that tool: the call alone, then with one or two of the
  episode's earlier successful calls before it (nearest first), shortest first (`focus_solutions`); validation
  keeps, per focus call, only the shortest that passes (`Abstraction.shortest_only`, `coevolve.synthesis`): a
  one-call `cat` task, or `cd` then `cat` when the file lies in a folder. An order focus (`cd > ls`, from
  `signals.unexplored_orders`) keeps the solutions that end in the order's calls, in turn: `cd`, then `ls`. A state
  focus (`cat@folder`, from `signals.unexplored_states`) keeps those whose last call acts in that state, as the
  env's `states` reads the solution from the start: `cd(folder='a')` then `cat(file_name='x')`, never `cat` alone.
- `LLMAbstractor`: any chat backend (`OpenAIBackend` for an OpenAI-compatible endpoint, e.g. `vllm serve` or
  `coevolve serve`). The prompt shows the tools, the context and the numbered log and asks for JSON
  `{"tasks": [{"intent", "query", "solution": [call, ...]}]}`. Replies are checked against that schema
  (`parse_reply`); a malformed reply is sent back with the reason, at most `max_format_retries` times. Endpoint
  errors are retried with backoff by the backend; after that, or past the deadline, the episode is skipped with
  its reason (`Abstraction.failure`) and synthesis goes on with less.

Nothing here executes anything: candidates go to validate.py.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from coevolve.envs.base import Env, step_failure
from coevolve.policy.backends import SamplingConfig
from coevolve.policy.chat import tool_description
from coevolve.records import Candidate, ExplorationEpisode, Step, Task, ToolCall, call_name
from coevolve.calls import parse_call
from coevolve.signals import PATTERN_SEPARATOR, holds_order
from coevolve.states import StatePatterns, is_state_pattern, state_tool
from coevolve.validate import ValidationConfig

@dataclass(frozen=True)
class Abstraction:
    """What one episode gave: its candidates, or why it gave none."""

    episode_id: str
    candidates: tuple[Candidate, ...]
    failure: str | None = None
    """`code: detail`, code `malformed_reply`, `endpoint_error` or `time_budget`, when the abstractor gave up on the
    episode."""
    attempts: int = 0
    """LLM requests made for this episode (0 for the template abstractor)."""
    shortest_only: bool = False
    """Candidates that end in the same call are alternatives, shortest first: validation keeps the first that
    passes and skips the rest (a focus episode's solutions, `focus_solutions`)."""

    @property
    def failure_code(self) -> str | None:
        return self.failure.split(":", 1)[0] if self.failure else None


def useful_steps(episode: ExplorationEpisode) -> list[Step]:
    """The episode's calls that parsed and ran without failing, in order."""
    return [step for step in episode.steps if step.call is not None and step_failure(step) is None]


def candidate_meta(task: Task, solution: Sequence[str]) -> dict[str, Any]:
    """The flagged task's env metadata (it defines the tools and checks), with `num_calls` (BFCL-lite's size note)
    rewritten for the new solution."""
    meta = dict(task.meta)
    if "num_calls" in meta:
        meta["num_calls"] = len(solution)
    return meta


def _tool_docs(env: Env, task: Task) -> list[Mapping[str, Any]]:
    return env.reset(task).tools()


# ---------------------------------------------------------------------------------------------------------------
# The template abstractor
# ---------------------------------------------------------------------------------------------------------------


def tool_phrase(doc: Mapping[str, Any] | None, name: str) -> str:
    """The tool's own one-sentence description (BFCL's text after `Tool description:`), without a final period."""
    return tool_description(doc, name)


def _argument_text(key: str | None, value: Any) -> str:
    if isinstance(value, str):
        return f"{key} '{value}'" if key else f"'{value}'"
    return f"{key} set to {json.dumps(value)}" if key else json.dumps(value)


def call_sentence(step: Step, docs: Mapping[str, Mapping[str, Any]]) -> str:
    call = step.call
    assert call is not None
    doc = docs.get(call.name) or {}
    phrase = tool_phrase(doc, call.name)
    properties = (doc.get("parameters") or {}).get("properties") or {}
    # An argument at its documented default asks for nothing ("ls(a=False)" is "list the contents").
    arguments = [_argument_text(key, value) for key, value in call.arguments.items()
                 if not (isinstance(properties.get(key), dict) and "default" in properties[key]
                         and properties[key]["default"] == value)]
    arguments += [_argument_text(None, value) for value in call.positional]
    return phrase + (", with " + " and ".join(arguments) if arguments else "")


def template_query(steps: Sequence[Step], docs: Mapping[str, Mapping[str, Any]]) -> str:
    sentences = [call_sentence(step, docs) for step in steps]
    if len(sentences) == 1:
        return sentences[0] + "."
    text = "First, " + sentences[0][0].lower() + sentences[0][1:] + "."
    for position, sentence in enumerate(sentences[1:], start=1):
        joiner = "Finally, " if position == len(sentences) - 1 else "Then, "
        text += " " + joiner + sentence[0].lower() + sentence[1:] + "."
    return text


def focus_of(episode: ExplorationEpisode, solution: Sequence[str], states: StatePatterns | None = None
             ) -> str | None:
    """The episode's focus when the solution makes it (calls the unexplored tool; makes the unexplored order's
    calls one right after the other; its last call acts in the unexplored state, by the env's `states`), else
    None."""
    if not episode.focus:
        return None
    if is_state_pattern(episode.focus):
        calls = [parse_call(text) for text in solution]
        if states is None or not calls or not all(isinstance(call, ToolCall) for call in calls):
            return None
        return episode.focus if states.patterns(calls)[-1] == episode.focus else None  # type: ignore[arg-type]
    names = [call_name(text) for text in solution]
    return episode.focus if holds_order(names, episode.focus.split(PATTERN_SEPARATOR)) else None


def focus_solutions(steps: Sequence[Step], focus: str, max_calls: int, states: StatePatterns | None = None
                    ) -> list[list[Step]]:
    """Every solution that ends in a call of `focus` among `steps` (an episode's successful calls): that call,
    preceded by up to `max_calls - 1` of the calls before it, in episode order; shorter solutions first, then
    earlier focus calls, then nearer preceding calls. Repeated solutions (the same call texts) appear once.
    A focus that is an order (`cd > ls`) keeps the solutions whose last calls are that order's tools, in turn; a
    focus that is a state (`cat@folder`) those whose last call acts in that state by the env's `states`, run from
    the start, and of those, per acting call, only the shortest (the calls that reach the state, nothing more)."""
    from itertools import combinations

    state = is_state_pattern(focus)
    order = [state_tool(focus)] if state else focus.split(PATTERN_SEPARATOR)
    found: list[tuple[int, int, int, list[Step]]] = []
    for end, step in enumerate(steps):
        if step.call is None or step.call.name != order[-1]:
            continue
        for extra in range(len(order) - 1, max(0, max_calls - 1) + 1):
            for picked in combinations(range(end - 1, -1, -1), extra):  # nearest first
                chosen = sorted(picked)
                solution = [steps[index] for index in chosen] + [step]
                if [s.call.name if s.call is not None else None for s in solution[-len(order):]] != order:
                    continue
                if state and (states is None or states.patterns([s.call for s in solution])[-1] != focus):
                    continue
                distance = sum(end - index for index in chosen)
                found.append((extra + 1, end, distance, solution))
    if state:  # per acting call, only the shortest solutions that reach its state: a leading `ls()` is not needed
        shortest = {end: min(size for size, at, _, _ in found if at == end) for _, end, _, _ in found}
        found = [item for item in found if item[0] == shortest[item[1]]]
    solutions: list[list[Step]] = []
    seen: set[tuple[str, ...]] = set()
    for _, _, _, solution in sorted(found, key=lambda item: item[:3]):
        texts = tuple(s.call.to_python() for s in solution)  # type: ignore[union-attr]
        if texts not in seen:
            seen.add(texts)
            solutions.append(solution)
    return solutions


@dataclass(frozen=True)
class TemplateAbstractor:
    """Windows of consecutive successful calls -> candidates with template queries (see the module docstring)."""

    max_solution_calls: int = ValidationConfig.max_solution_calls
    max_candidates_per_episode: int = 8
    name: str = "template"

    def abstract(self, env: Env, episodes: Sequence[ExplorationEpisode], tasks: Mapping[str, Task],
                 deadline: float | None = None) -> list[Abstraction]:
        docs_by_task: dict[str, dict[str, Mapping[str, Any]]] = {}
        results = []
        for episode in episodes:
            task = tasks[episode.task_id]
            if task.id not in docs_by_task:
                docs_by_task[task.id] = {doc["name"]: doc for doc in _tool_docs(env, task)}
            results.append(self._one(episode, task, docs_by_task[task.id], env.states))
        return results

    def _one(self, episode: ExplorationEpisode, task: Task, docs: Mapping[str, Mapping[str, Any]],
             states: StatePatterns) -> Abstraction:
        steps = useful_steps(episode)
        windows: list[list[Step]] = []
        seen: set[tuple[str, ...]] = set()
        if episode.focus:
            windows = focus_solutions(steps, episode.focus, self.max_solution_calls, states)
        for length in range(1, self.max_solution_calls + 1) if not episode.focus else ():  # shortest first
            for start in range(0, len(steps) - length + 1):
                window = steps[start:start + length]
                solution = tuple(step.call.to_python() for step in window)  # type: ignore[union-attr]
                if solution not in seen:
                    seen.add(solution)
                    windows.append(window)
        candidates = []
        for window in windows[: self.max_candidates_per_episode]:
            solution = [step.call.to_python() for step in window]  # type: ignore[union-attr]
            intent = " then ".join(tool_phrase(docs.get(s.call.name), s.call.name).lower()  # type: ignore[union-attr]
                                   for s in window)
            candidates.append(Candidate.create(
                task.env, intent, template_query(window, docs), solution, task.initial_state,
                candidate_meta(task, solution), task.id, episode.signal, episode.id, self.name,
                episode.focus,  # a focus episode's windows all end in its focus call (focus_solutions)
            ))
        return Abstraction(episode.id, tuple(candidates), shortest_only=bool(episode.focus))


# ---------------------------------------------------------------------------------------------------------------
# The LLM abstractor
# ---------------------------------------------------------------------------------------------------------------

SYSTEM_PROMPT = """You turn logs of tool use into training tasks for an AI assistant.
You get the tools, and a numbered log of calls an explorer made with what each returned.
Write up to {max_tasks} tasks a user could ask that these calls accomplish. For each task give:
- "intent": a few words on what the task achieves;
- "query": what the user says, in natural language, with every name and value the calls need;
- "solution": the calls that solve it, copied exactly from the successful calls of the log, in order (at most {max_calls}).
Reply with one JSON object and nothing else: {{"tasks": [{{"intent": "...", "query": "...", "solution": ["call(...)", ...]}}]}}"""


def _extract_json(text: str) -> Any:
    """The JSON object in a reply: the whole text, or a ```json fence, or the span from the first `{` to the last `}`."""
    text = text.strip()
    fence = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    if fence:
        text = fence.group(1).strip()
    try:
        return json.loads(text)
    except ValueError:
        start, end = text.find("{"), text.rfind("}")
        if 0 <= start < end:
            return json.loads(text[start:end + 1])
        raise


def parse_reply(text: str, max_tasks: int, max_calls: int, max_chars: int = 2000) -> list[dict[str, Any]] | str:
    """The reply's tasks, checked against the schema, or the reason it does not fit (sent back to the LLM)."""
    if len(text) > 64 * max_chars:
        return f"the reply is {len(text)} characters long; keep it short"
    try:
        value = _extract_json(text)
    except ValueError as error:
        return f"the reply is not JSON ({str(error)[:120]})"
    if not isinstance(value, dict) or not isinstance(value.get("tasks"), list):
        return 'the reply must be an object with a "tasks" list'
    tasks = value["tasks"]
    if not tasks:
        return '"tasks" is empty'
    if len(tasks) > max_tasks:
        return f'"tasks" has {len(tasks)} entries; at most {max_tasks}'
    checked = []
    for index, item in enumerate(tasks, start=1):
        where = f"task {index}"
        if not isinstance(item, dict):
            return f"{where} is not an object"
        missing = [key for key in ("intent", "query", "solution") if key not in item]
        if missing:
            return f"{where} lacks {', '.join(missing)}"
        if not isinstance(item["intent"], str) or not isinstance(item["query"], str) or not item["query"].strip():
            return f'{where}: "intent" and "query" must be strings, "query" not empty'
        if len(item["query"]) > max_chars or len(item["intent"]) > max_chars:
            return f"{where}: intent or query longer than {max_chars} characters"
        solution = item["solution"]
        if not isinstance(solution, list) or not solution or not all(isinstance(c, str) for c in solution):
            return f'{where}: "solution" must be a non-empty list of call strings'
        if len(solution) > max_calls:
            return f'{where}: "solution" has {len(solution)} calls; at most {max_calls}'
        checked.append({"intent": item["intent"].strip(), "query": item["query"].strip(),
                        "solution": [call.strip() for call in solution]})
    return checked


def episode_log(episode: ExplorationEpisode, observation_chars: int = 300) -> str:
    lines = []
    for number, step in enumerate(episode.steps, start=1):
        failure = step_failure(step)
        status = f"FAILED ({failure[:120]})" if failure else "ok"
        lines.append(f"{number}. {step.action[:300]} -> {status}: {step.observation[:observation_chars]}")
    return "\n".join(lines) if lines else "(no calls)"


@dataclass
class LLMAbstractor:
    """An LLM abstracts episodes into candidates (see the module docstring). `backend` is a chat backend:
    `chat(conversations, tools, sampling) -> [Generation]`, with `Generation.error` set when it gave up."""

    backend: Any
    max_tasks_per_episode: int = 3
    max_solution_calls: int = ValidationConfig.max_solution_calls
    max_format_retries: int = 2
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=0.2, max_new_tokens=512))
    name: str = "llm"

    def messages(self, episode: ExplorationEpisode, task: Task, docs: Sequence[Mapping[str, Any]]) -> list[dict]:
        tools = "\n".join(f"- {doc['name']}({', '.join((doc.get('parameters') or {}).get('properties', {}))}): "
                          f"{tool_phrase(doc, doc['name'])}" for doc in docs)
        signal = episode.signal or "none (random exploration)"
        user = (f"Tools:\n{tools}\n\nSignal that started this exploration: {signal}\n\n"
                f"Log:\n{episode_log(episode)}\n\nReply with the JSON object only.")
        system = SYSTEM_PROMPT.format(max_tasks=self.max_tasks_per_episode, max_calls=self.max_solution_calls)
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def abstract(self, env: Env, episodes: Sequence[ExplorationEpisode], tasks: Mapping[str, Task],
                 deadline: float | None = None) -> list[Abstraction]:
        results: dict[str, Abstraction] = {}
        pending: dict[str, list[dict]] = {}
        attempts: dict[str, int] = {}
        docs_by_task: dict[str, list[Mapping[str, Any]]] = {}
        for episode in episodes:
            if not useful_steps(episode):
                results[episode.id] = Abstraction(episode.id, ())  # nothing worked: nothing to abstract, no request
                continue
            task = tasks[episode.task_id]
            if task.id not in docs_by_task:
                docs_by_task[task.id] = _tool_docs(env, task)
            pending[episode.id] = self.messages(episode, task, docs_by_task[task.id])
        by_id = {episode.id: episode for episode in episodes}
        for round_index in range(self.max_format_retries + 1):
            if not pending:
                break
            if deadline is not None and time.monotonic() >= deadline:
                for episode_id in pending:
                    results[episode_id] = Abstraction(episode_id, (), "time_budget: synthesis ran out of "
                                                      "time", attempts.get(episode_id, 0))
                pending = {}
                break
            ids = list(pending)
            replies = self.backend.chat([pending[i] for i in ids], [[] for _ in ids], self.sampling)
            next_round: dict[str, list[dict]] = {}
            for episode_id, reply in zip(ids, replies):
                attempts[episode_id] = attempts.get(episode_id, 0) + 1
                if reply.error is not None:
                    results[episode_id] = Abstraction(episode_id, (), f"endpoint_error: {reply.error}",
                                                      attempts[episode_id])
                    continue
                parsed = parse_reply(reply.text, self.max_tasks_per_episode, self.max_solution_calls)
                if isinstance(parsed, str):
                    if round_index == self.max_format_retries:
                        results[episode_id] = Abstraction(
                            episode_id, (), f"malformed_reply: {parsed} (after {attempts[episode_id]} replies)",
                            attempts[episode_id])
                    else:
                        next_round[episode_id] = pending[episode_id] + [
                            {"role": "assistant", "content": reply.text[:4000]},
                            {"role": "user", "content": f"That reply cannot be used: {parsed}. "
                                                        "Reply again with the JSON object only."},
                        ]
                    continue
                episode = by_id[episode_id]
                task = tasks[episode.task_id]
                candidates = tuple(
                    Candidate.create(task.env, item["intent"], item["query"], item["solution"], task.initial_state,
                                     candidate_meta(task, item["solution"]), task.id, episode.signal, episode.id,
                                     self.name, focus_of(episode, item["solution"], env.states))
                    for item in parsed
                )
                results[episode_id] = Abstraction(episode_id, candidates, None, attempts[episode_id])
            pending = next_round
        return [results[episode.id] for episode in episodes]
