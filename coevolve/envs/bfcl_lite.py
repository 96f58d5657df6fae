"""BFCL-lite: a small BFCL-backed environment for CPU work (the offline quickstart and the CPU experiments).

Why: the full BFCL-V3 multi-turn entries (long prompts, 18-30 tools, 3-8 turns) are far beyond what a 135M model on
two CPU cores can learn from; measured before this env existed, SmolLM2-135M solved some one-call file-system tasks
with six tools, and none with two calls. BFCL-lite keeps BFCL's backend, dispatch and scoring (the same `BFCLEpisode`:
state and response checks against the ground truth) and generates short single-turn tasks over six
GorillaFileSystem tools, from one call (most) to `max_calls` calls (a curriculum step: `cd` then act there).

Generation is seeded and deterministic: task i is drawn from `random.Random(f"{seed}:{i}")`, so a task set is
the same on every machine. Every task is checked when generated: its ground truth runs without an error and
either changes the file system or returns information (a task that does neither is dropped). The held-out split
is chosen by the task's content id (`held_out_fraction` of the id space), so it never overlaps the train split
and does not depend on how many tasks were generated.

The coverage-shift setting (`train_max_calls: 1`, configs/lite-shift.yaml): the train split keeps only its one-call
tasks (D_0, and so the worked examples drawn from it, never show two calls), while the held-out split still mixes
one- and two-call tasks. The two-call part (`cd` into a folder, then act there) is what D_0 misses and what
exploration can reach: every tool stays in the prompt, and `cd` followed by an action runs in the env.

The tool-shift setting (`train_without_tools: [cat, cd]`, configs/lite-tools.yaml): the train split drops every
task whose ground truth calls one of those tools, so neither D_0 nor the worked examples ever use them, while their
schemas stay in the prompt and the held-out split keeps their tasks. Unlike the two-call shift, the missing part
is one call long, within reach of what a small learner already does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields, replace
from typing import Any, Callable

from coevolve.envs import ENVS
from coevolve.calls import DEFAULT_LIMITS, CallLimits
from coevolve.envs.bfcl import MAX_REPLIES_PER_TURN, BFCLEnv, TruthTrace, _Backend, _function_docs
from coevolve.records import Task

LITE_TOOLS = ("ls", "cd", "mkdir", "touch", "cat", "rm")
SPLITS = ("train", "test")

_USERS = ("alex", "sam", "robin", "kim", "jordan", "taylor", "morgan", "casey")
_DIRS = ("documents", "photos", "projects", "notes", "archive", "reports", "music", "drafts", "backup", "data")
_FILES = ("todo.txt", "budget.csv", "report.pdf", "notes.md", "draft.txt", "summary.txt", "plan.md", "log.txt",
          "ideas.txt", "data.json", "readme.md", "invoice.pdf")
_NEW_FILES = ("agenda.txt", "list.md", "results.csv", "memo.txt", "outline.md", "letter.txt", "tasks.txt")
_NEW_DIRS = ("temp", "old", "shared", "review", "final", "images", "exports", "misc")
_CONTENTS = ("Buy milk and eggs.", "Q3 spend: 1200 USD.", "Meeting at 10am on Monday.", "Step 1: gather data.",
             "Total: 42 items.", "Draft v2, needs review.", "Error at line 7.", "All tests passed.")


@dataclass(frozen=True)
class LiteConfig:
    """What BFCL-lite generates."""

    num_tasks: int = 160
    """Tasks drawn before the split (train gets about 1 - held_out_fraction of them)."""
    held_out_fraction: float = 0.25
    """Share of the content-id space that forms the held-out `test` split."""
    max_calls: int = 2
    """Longest ground truth: 1 = one-call tasks only; 2 adds `cd` followed by one action in that folder."""
    two_call_share: float = 0.3
    """Share of tasks drawn from the two-call templates (when `max_calls` >= 2)."""
    train_max_calls: int | None = None
    """Longest ground truth kept in the train split (None: `max_calls`). 1 with `max_calls` 2 is the coverage-shift
    setting: the train split's two-call tasks are dropped, the held-out split keeps them."""
    train_without_tools: tuple[str, ...] = ()
    """Tools no train-split task calls (its tasks that call one are dropped; the held-out split keeps them): the
    tool-shift setting."""
    seed: int = 0
    """Seed of the generator; the same seed gives the same tasks everywhere."""

    def __post_init__(self) -> None:
        if self.num_tasks < 1 or not 0.0 < self.held_out_fraction < 1.0 or self.max_calls not in (1, 2):
            raise ValueError(f"invalid BFCL-lite config: {self}")
        if not 0.0 <= self.two_call_share <= 1.0:
            raise ValueError(f"two_call_share must lie in [0, 1], got {self.two_call_share}")
        if self.train_max_calls is not None and self.train_max_calls not in range(1, self.max_calls + 1):
            raise ValueError(f"train_max_calls must lie in [1, max_calls={self.max_calls}], got {self.train_max_calls}")
        unknown = sorted(set(self.train_without_tools) - set(LITE_TOOLS))
        if isinstance(self.train_without_tools, str) or unknown:
            raise ValueError(f"train_without_tools must list BFCL-lite tools ({', '.join(LITE_TOOLS)}), "
                             f"got {self.train_without_tools!r}")
        object.__setattr__(self, "train_without_tools", tuple(self.train_without_tools))  # a YAML list, say


# --------------------------------------------------------------------------------------------------------------
# Task templates: (rng, scenario) -> (query, calls) or None when the scenario does not fit
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scenario:
    user: str
    root_files: dict[str, str]
    folders: dict[str, dict[str, str]]  # folder -> file -> content
    hidden: bool

    def config(self) -> dict:
        contents: dict = {name: {"type": "file", "content": text} for name, text in self.root_files.items()}
        if self.hidden:
            contents[".settings"] = {"type": "file", "content": "theme=dark"}
        for folder, files in self.folders.items():
            contents[folder] = {"type": "directory", "contents": {
                name: {"type": "file", "content": text} for name, text in files.items()}}
        return {"GorillaFileSystem": {"root": {self.user: {"type": "directory", "contents": contents}}}}


Template = Callable[[random.Random, _Scenario], "tuple[str, list[str]] | None"]


def _pick(rng: random.Random, options, exclude=()) -> str | None:
    choices = [option for option in options if option not in exclude]
    return rng.choice(choices) if choices else None


def _ls(rng, s):
    if s.hidden and rng.random() < 0.5:
        return rng.choice(["List everything in the current folder, hidden files included.",
                           "Show all files here, including the hidden ones."]), ["ls(a=True)"]
    return rng.choice(["What is in the current folder?", "List the files here.",
                       "Show me the contents of this directory."]), ["ls()"]


def _one_call(tool: str, argument: str, choose, phrases: tuple[str, ...]) -> Template:
    """A one-call task: `choose` picks the argument from the scenario (None: the template does not fit)."""

    def template(rng, s):
        name = choose(rng, s)
        if name is None:
            return None
        return rng.choice(phrases).format(name), [f"{tool}({argument}='{name}')"]

    return template


def _existing(names):
    return lambda rng, s: rng.choice(sorted(names(s))) if names(s) else None


_mkdir = _one_call("mkdir", "dir_name", lambda rng, s: _pick(rng, _NEW_DIRS, s.folders), (
    "Create a folder named '{}'.", "Make a new directory called '{}'.", "Add a '{}' folder here."))
_touch = _one_call("touch", "file_name", lambda rng, s: _pick(rng, _NEW_FILES, s.root_files), (
    "Create an empty file called '{}'.", "Make a new file named '{}'.", "Touch a file '{}'."))
_cat = _one_call("cat", "file_name", _existing(lambda s: s.root_files), (
    "Show me what is inside '{}'.", "Print the contents of '{}'.", "What does '{}' say?"))
_rm = _one_call("rm", "file_name", _existing(lambda s: s.root_files), (
    "Delete the file '{}'.", "Remove '{}' from this folder.", "Please get rid of '{}'."))
_cd = _one_call("cd", "folder", _existing(lambda s: s.folders), (
    "Go into the '{}' folder.", "Change into the directory '{}'.", "Open the '{}' folder."))


def _cd_then(action: str) -> Template:
    def template(rng, s):
        if not s.folders:
            return None
        folder = rng.choice(sorted(s.folders))
        files = s.folders[folder]
        if action == "mkdir":
            name = _pick(rng, _NEW_DIRS, files)
            return f"Go into '{folder}' and create a folder named '{name}' there.", [
                f"cd(folder='{folder}')", f"mkdir(dir_name='{name}')"]
        if action == "touch":
            name = _pick(rng, _NEW_FILES, files)
            return f"In the '{folder}' folder, create an empty file '{name}'.", [
                f"cd(folder='{folder}')", f"touch(file_name='{name}')"]
        if action == "ls":
            return f"Go into '{folder}' and list what is there.", [f"cd(folder='{folder}')", "ls()"]
        if not files:
            return None
        name = rng.choice(sorted(files))
        if action == "cat":
            return f"Open the '{folder}' folder and show me '{name}'.", [
                f"cd(folder='{folder}')", f"cat(file_name='{name}')"]
        return f"In the '{folder}' folder, delete '{name}'.", [f"cd(folder='{folder}')", f"rm(file_name='{name}')"]

    return template


ONE_CALL_TEMPLATES: tuple[Template, ...] = (_ls, _mkdir, _touch, _cat, _rm, _cd)
TWO_CALL_TEMPLATES: tuple[Template, ...] = tuple(_cd_then(action) for action in ("mkdir", "touch", "ls", "cat", "rm"))


def _scenario(rng: random.Random) -> _Scenario:
    folders = {
        folder: {name: rng.choice(_CONTENTS) for name in rng.sample(_FILES, rng.randint(0, 2))}
        for folder in rng.sample(_DIRS, rng.randint(1, 3))
    }
    root_files = {name: rng.choice(_CONTENTS) for name in rng.sample(_FILES, rng.randint(1, 3))}
    return _Scenario(rng.choice(_USERS), root_files, folders, hidden=rng.random() < 0.4)


def _meta() -> dict:
    excluded = [doc["name"] for doc in _function_docs("GorillaFileSystem") if doc["name"] not in LITE_TOOLS]
    return {"category": "lite", "involved_classes": ["GorillaFileSystem"], "missed_function": {},
            "excluded_function": excluded, "long_context": False}


def _is_useful(task: Task) -> bool:
    """The ground truth runs without an error and changes the state or returns information."""
    trace = TruthTrace.of(task, DEFAULT_LIMITS)
    results = [result for turn in trace.results for result in turn]
    if any('"error"' in result or result.startswith("Error during execution") for result in results):
        return False
    changed = trace.states[-1] != _Backend(task).state()
    informative = any(result not in ("None", "{}") for result in results)
    return changed or informative


def generate_tasks(config: LiteConfig = LiteConfig()) -> list[Task]:
    """All generated tasks (both splits), deterministic for a config, without duplicates."""
    tasks: dict[str, Task] = {}
    meta = _meta()
    for index in range(config.num_tasks):
        rng = random.Random(f"{config.seed}:{index}")
        scenario = _scenario(rng)
        two_calls = config.max_calls >= 2 and rng.random() < config.two_call_share
        templates = TWO_CALL_TEMPLATES if two_calls else ONE_CALL_TEMPLATES
        drawn = None
        for template in rng.sample(templates, len(templates)):  # the first template that fits the scenario
            drawn = template(rng, scenario)
            if drawn is not None:
                break
        if drawn is None:
            continue
        query, calls = drawn
        task = Task.create("bfcl-lite", f"lite_{config.seed}_{index}", [[{"role": "user", "content": query}]],
                           scenario.config(), [calls], {**meta, "num_calls": len(calls)})
        if task.id not in tasks and _is_useful(task):
            tasks[task.id] = task
    return list(tasks.values())


def split_of(task: Task, held_out_fraction: float) -> str:
    """`test` for the held-out share of the content-id space, else `train`."""
    return "test" if int(task.id, 16) / 16 ** len(task.id) < held_out_fraction else "train"


@ENVS.register("bfcl-lite")
class BFCLLiteEnv(BFCLEnv):
    """BFCL-lite tasks of one split, scored by BFCL's own checks (see the module docstring)."""

    name = "bfcl-lite"

    def __init__(
        self,
        split: str = "train",
        config: LiteConfig = LiteConfig(),
        scope: str = "exposed",
        max_replies_per_turn: int = MAX_REPLIES_PER_TURN,
        limits: CallLimits = DEFAULT_LIMITS,
        truth_cache_size: int = 512,
        **generator: Any,
    ) -> None:
        """`generator`: LiteConfig's fields by name (`num_tasks`, `train_max_calls`, ...; what `env.options` of a
        config holds), applied over `config`."""
        if split not in SPLITS:
            raise ValueError(f"unknown BFCL-lite split {split!r}; choose one of {SPLITS}")
        unknown = sorted(set(generator) - {f.name for f in fields(LiteConfig)})
        if unknown:
            raise TypeError(f"unknown BFCL-lite option(s) {unknown}; LiteConfig has "
                            f"{[f.name for f in fields(LiteConfig)]}")
        config = replace(config, **generator)
        super().__init__("multi_turn_base", scope, max_replies_per_turn, limits, truth_cache_size)
        self.category = f"lite/{split}"
        self.split = split
        self.config = config

    def tasks(self) -> list[Task]:
        if self._tasks is None:
            train = self.split == "train"
            longest = self.config.train_max_calls if train else None
            left_out = set(self.config.train_without_tools) if train else set()
            self._tasks = [t for t in generate_tasks(self.config)
                           if split_of(t, self.config.held_out_fraction) == self.split
                           and (longest is None or t.meta["num_calls"] <= longest)
                           and not left_out & set(t.truth_tools)]
        return list(self._tasks)
