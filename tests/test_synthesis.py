"""Synthesis end to end on BFCL-lite: real rollouts of a tiny model -> signal events -> offline
exploration -> template abstraction -> validation -> tasks that join the pool and are solved by replaying their
solution. Plus the random-exploration ablation, trouble that shrinks the phase instead of stopping it, and the
config's `synthesis` section."""

from __future__ import annotations

import pytest

from coevolve.abstract import LLMAbstractor, TemplateAbstractor
from coevolve.config import ConfigError, load_config
from coevolve.envs.bfcl_lite import BFCLLiteEnv
from coevolve.evaluate import evaluate, oracle_script
from coevolve.explore import ExploreConfig, OfflineExplorer, random_contexts
from coevolve.synthesis import build_abstractor, build_explorer, signal_contexts, synthesis_phase
from coevolve.pool import TaskPool
from coevolve.signals import SignalConfig, extract_signals
from coevolve.validate import Validator

from support import ls_tasks


@pytest.fixture(scope="module")
def iteration_one(ls_policy_dir):
    """One iteration's real rollouts: a tiny model taught to answer `[ls()]` or `[pwd()]` on 4 `ls()` tasks
    (mixed groups: boundary) and 4 other tasks it fails (with a history of success there: forgetting)."""
    from coevolve.policy.chat import ChatRenderer
    from coevolve.policy.hf_backend import TransformersBackend
    from coevolve.policy.models import load_model
    from coevolve.policy.backends import SamplingConfig
    from coevolve.rollout import RolloutConfig, rollout

    env = BFCLLiteEnv("train")
    others = [t for t in env.tasks() if t.ground_truth[0][0].startswith(("cat(", "mkdir("))][:4]
    tasks = ls_tasks(4) + others
    model, tokenizer = load_model(str(ls_policy_dir), dtype="float32", device="cpu")
    batch = rollout(env, tasks, TransformersBackend(model, tokenizer), ChatRenderer(tokenizer, "python"),
                    RolloutConfig(group_size=4, max_new_tokens=12, max_replies_per_turn=1,
                                  sampling=SamplingConfig(temperature=1.0, seed=0)), iteration=1)
    history = {task.id: [1.0] for task in others}
    events = extract_signals(batch.trajectories, history, SignalConfig(), iteration=1).events
    return env, tasks, batch.trajectories, events


def test_signals_from_real_rollouts_become_validated_tasks(iteration_one, tmp_path):
    env, tasks, trajectories, events = iteration_one
    kinds = {event.kind for event in events}
    assert {"boundary", "forgetting"} <= kinds, [e.kind for e in events]
    by_id = {task.id: task for task in tasks}
    contexts = signal_contexts(events, by_id, {t.id: t for t in trajectories}, max_contexts=16)
    signals = [c.signal for c in contexts]  # the kinds take turns: F, B, (R,) F, B, ... until a kind runs out
    first_gap = {kind: signals.index(kind) for kind in set(signals)}
    assert sorted(first_gap.values()) == list(range(len(first_gap))), signals
    assert signals[0] == "forgetting" and signals[1] == "boundary", signals
    pool_tasks = env.tasks()
    with TaskPool(tmp_path / "pool.sqlite") as pool:
        pool.add_tasks(pool_tasks, iteration=0)
        validator = Validator(env, known=pool.tasks_at(0))
        result = synthesis_phase(env, contexts, by_id, OfflineExplorer(ExploreConfig(step_budget=6)),
                                TemplateAbstractor(), validator, iteration=1, seed=0)
        summary = result.summary()
        fraction = summary["accepted"] / summary["candidates"]
        print(f"\nsynthesis on BFCL-lite: {summary['contexts']} contexts, {summary['candidates']} candidates, "
              f"{summary['accepted']} accepted ({fraction:.0%}), rejected by code {summary['rejected_by_code']}")
        assert summary["contexts"] == len(contexts) and summary["episodes"] == len(contexts)
        assert summary["accepted"] > 0 and summary["rejected"] > 0 and not summary["skipped"]
        assert summary["accepted"] + summary["rejected"] == summary["candidates"]
        assert set(summary["seconds"]) == {"explore", "abstract", "validate"}
        admitted = result.admitted
        # Solvable by replaying their solution: oracle accuracy 1.0.
        assert evaluate(env, list(admitted), oracle_script, "oracle").accuracy == 1.0
        # They join D_2 with their lineage; the pool refuses none (the validator already checked duplicates).
        added = pool.add_tasks(admitted, iteration=2)
        assert len(added.admitted) == len(admitted) and not added.refused
        contexts_by_id = {c.id: c for c in contexts}
        episodes = {e.id: e for e in result.episodes}
        for task in admitted:
            provenance = task.provenance
            assert provenance.source == "synthetic" and provenance.iteration == 1
            episode = episodes[provenance.episode_id]
            assert contexts_by_id[episode.context_id].signal == provenance.signal
            assert provenance.parent_id == episode.task_id
        assert len(pool.tasks_at(2, source="synthetic")) == len(admitted)
    lineage = result.lineage()
    assert len(lineage) == summary["candidates"] and sum(row["accepted"] for row in lineage) == len(admitted)
    row = next(row for row in lineage if row["accepted"])
    assert row["trajectory_ids"] and row["signal"] in ("forgetting", "boundary") and row["explorer"] == "offline"
    assert row["task_id"] in {task.id for task in admitted} and row["solution"]
    assert all(r["reasons"] for r in lineage if not r["accepted"])


def test_random_exploration_has_the_same_budget_and_no_signal(iteration_one):
    env, tasks, trajectories, events = iteration_one
    by_id = {task.id: task for task in tasks}
    contexts = random_contexts(tasks, count=len(events), iteration=1, seed=0)
    result = synthesis_phase(env, contexts, by_id, OfflineExplorer(ExploreConfig(step_budget=6)),
                            TemplateAbstractor(), Validator(env, known=env.tasks()), iteration=1)
    assert len(result.episodes) == len(events) and all(len(e.steps) == 6 for e in result.episodes)
    assert result.summary()["contexts_by_signal"] == {"random": len(events)}
    assert all(task.provenance.signal is None for task in result.admitted)


class _Broken:
    name = "broken"

    def explore(self, *args, **kwargs):
        raise RuntimeError("the explorer's GPU fell over")

    def abstract(self, *args, **kwargs):
        raise RuntimeError("the abstractor fell over")


def test_trouble_shrinks_the_phase_and_is_counted(iteration_one):
    env, tasks, _, _ = iteration_one
    by_id = {task.id: task for task in tasks}
    contexts = random_contexts(tasks, count=3, iteration=1, seed=0)
    validator = Validator(env)
    broken = synthesis_phase(env, contexts, by_id, _Broken(), TemplateAbstractor(), validator, iteration=1)
    assert broken.skipped == {"explorer_error": 3} and not broken.episodes
    broken = synthesis_phase(env, contexts, by_id, OfflineExplorer(), _Broken(), validator, iteration=1)
    assert broken.skipped == {"abstractor_error": 3} and len(broken.episodes) == 3 and not broken.candidates
    spent = synthesis_phase(env, contexts, by_id, OfflineExplorer(), TemplateAbstractor(), validator, iteration=1,
                           time_budget_seconds=0.0)
    assert spent.skipped == {"time_budget": 3} and not spent.episodes


def test_the_config_section_builds_the_phase(tmp_path):
    env = BFCLLiteEnv("train")
    section = load_config(None).synthesis
    explorer, abstractor = build_explorer(section), build_abstractor(section)
    validator = Validator(env, section.validation())
    assert isinstance(explorer, OfflineExplorer) and isinstance(abstractor, TemplateAbstractor)
    assert validator.config.dedup_threshold == 0.9 and validator.config.check_execution
    assert validator.config.max_solution_calls == abstractor.max_solution_calls == section.max_solution_calls
    config = load_config(None, ["synthesis.abstractor=llm", "synthesis.llm_base_url=http://127.0.0.1:9/v1",
                                "synthesis.dedup_threshold=0.8", "synthesis.check_execution=false",
                                "synthesis.step_budget=3"])
    explorer, abstractor = build_explorer(config.synthesis), build_abstractor(config.synthesis)
    validator = Validator(env, config.synthesis.validation())
    assert isinstance(abstractor, LLMAbstractor) and explorer.config.step_budget == 3
    assert validator.config.dedup_threshold == 0.8 and not validator.config.check_execution
    with pytest.raises(ConfigError, match="synthesis.llm_base_url"):
        load_config(None, ["synthesis.abstractor=llm"])
    with pytest.raises(ConfigError, match="synthesis.explorer"):
        load_config(None, ["synthesis.explorer=magic"])


def test_the_policy_explores_through_its_own_backend_and_an_llm_explorer_needs_an_endpoint():
    """`synthesis.explorer: policy` is the model being trained (its backend and prompt); `llm` without an endpoint
    is refused when the config is read, with the setting that works named."""
    from coevolve.explore import LLMExplorer
    from coevolve.policy.chat import ChatRenderer

    section = load_config(None, ["synthesis.explorer=policy"]).synthesis
    backend, renderer = object(), ChatRenderer(None, "python")
    explorer = build_explorer(section, backend, renderer)
    assert isinstance(explorer, LLMExplorer) and explorer.backend is backend and explorer.renderer is renderer
    assert explorer.name == "policy"
    with pytest.raises(ValueError, match="backend"):
        build_explorer(section)
    with pytest.raises(ConfigError, match=r"synthesis\.explorer: llm needs .* synthesis\.explorer: policy"):
        load_config(None, ["synthesis.explorer=llm"])


def test_old_keys_work_for_one_release_with_a_warning_naming_the_new_key():
    with pytest.warns(FutureWarning, match=r"feedback\.max_contexts is now synthesis\.max_contexts"):
        config = load_config(None, ["feedback.max_contexts=5"])
    assert config.synthesis.max_contexts == 5
    with pytest.warns(FutureWarning, match=r"grpo\.num_iterations is now grpo\.passes_per_batch"):
        assert load_config(None, ["grpo.num_iterations=2", "loop.steps_per_iteration=4"]).grpo.passes_per_batch == 2
    with pytest.warns(FutureWarning, match=r"loop\.signals is now signals\.enabled"):
        assert load_config(None, ["loop.signals=[rare]"]).signals.enabled == ("rare",)
    with pytest.raises(ConfigError, match=r"loop\.window and signals\.window"):
        load_config(None, ["loop.window=2", "signals.window=4"])


def test_capped_contexts_take_turns_by_kind():
    """A cap never leaves a kind that fired unexplored: with 5 boundary events, 1 rare and 1 forgetting and room
    for 3, each kind gets one (strict priority gave forgetting + 2 boundary, and rare nothing)."""
    from coevolve.records import SignalEvent, Task

    tasks = [Task.create("bfcl-lite", f"t{i}", [[{"role": "user", "content": f"q{i}"}]], {}, [["ls()"]])
             for i in range(7)]
    kinds = ["boundary"] * 5 + ["rare", "forgetting"]
    events = [SignalEvent(kind, task.id, 1, (), {}) for kind, task in zip(kinds, tasks)]
    by_id = {task.id: task for task in tasks}
    assert [c.signal for c in signal_contexts(events, by_id, {}, max_contexts=3)] == ["forgetting", "boundary", "rare"]
    assert [c.task_id for c in signal_contexts(events, by_id, {}, max_contexts=5)] == [
        tasks[6].id, tasks[0].id, tasks[5].id, tasks[1].id, tasks[2].id]
