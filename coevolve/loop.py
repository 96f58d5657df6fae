"""The CoEvolve loop (arXiv 2604.15840): the agent trains on D_{t-1}, its rollouts say where it is weak, and new
tasks synthesized there form D_t. One iteration is one function, `coevolve_iteration`, read top to bottom:

    tasks        = sample_tasks(run, t)                              # 1. a seeded sample of D_{t-1}
    trajectories = grpo_steps(run, t, tasks)                         # 2. GRPO steps on them (TRL)
    report       = mine_signals(run, t, trajectories)                # 3. forgetting, boundary, rare
    contexts     = choose_contexts(run, t, report, trajectories)     # 4. where to explore
    deadline     = Deadline.after(synthesis.time_budget_seconds)     #    one budget for phases 5-7
    explored     = explore_contexts(run, t, contexts, deadline)      # 5. fresh episodes in the env
    abstracted   = abstract_episodes(run, t, explored, deadline)     # 6. episodes -> candidate tasks
    validated    = validate_candidates(run, t, abstracted, deadline) # 7. each candidate executed and checked
    synthesis    = admit(run, t, contexts, ...)                      # 8. D_t = D_{t-1} ∪ accepted
    heldout      = evaluate_heldout(run, t)                          # 9. greedy success on the held-out set
    metrics      = record_iteration(run, t, ...)                     # 10. one line of metrics.jsonl: the commit

    coevolve train --config configs/quickstart.yaml [--output-dir DIR] [--resume] [section.key=value ...]

Glossary (one word per concept, in code, config and metrics alike):
    iteration t   one round of the loop above (t = 1..T; iteration 0 is the policy before training);
                  `loop.steps_per_iteration` GRPO steps, `run.max_steps` in all
    step          one optimizer step: `grpo.prompts_per_step` tasks x `rollout.group_size` rollouts
    pass          one optimisation pass over a step's rollouts (`grpo.passes_per_batch`, mu; TRL says
                  an iteration, a word this project keeps for the loop)
    group         the K = `rollout.group_size` rollouts of one task in one step (GRPO's advantage baseline)
    slot          a row of the trainer's dataset; in iteration t it stands for one task of t's sample
    D_t           the task pool after iteration t (`coevolve.pool`): D_0 = the seed tasks, plus admitted tasks
    signal        a forgetting, boundary or rare event on a task, from one iteration's rollouts (`coevolve.signals`)
    context       what one exploration starts from: a flagged task and the signal's evidence (`coevolve.explore`)
    episode       one exploration of the env from a context: (action, observation) steps
    candidate     a task abstracted from an episode: intent, query, solution (`coevolve.abstract`)
    verdict       validation's accept or reject, with a reason per failed check (`coevolve.validate`)
    synthesis     explore -> abstract -> validate (phases 5-7; `coevolve.synthesis`, config section `synthesis`)
    feedback      signals + synthesis: what the loop adds between two iterations' training (the paper reports its
                  share of the wall time, ~10%; metrics.jsonl's `feedback_share`)

Modes (`run.mode`): zero-shot (iteration 0's evaluation only), static (GRPO on D_0; signals are still counted),
synthetic (one synthesis pass over random contexts of D_0 before training, then static), random (contexts drawn at
random, as many as the signals would have given), coevolve. `loop.d0: explored` (the paper's BFCL protocol): D_0 is
what one synthesis pass admits before training, the env's tasks only start explorations. `signals.enabled`
switches signals off; `synthesis.check_execution: false` switches validation by execution off.

Where this departs from the paper (the one list; the modules named say more). The STEERING switches of 6-9 are
off by default, on in the shipped coevolve configs (`coevolve.config.STEERING`; off again: `train --paper`):
1. Iterations are counted in optimizer steps (`loop.steps_per_iteration`); the paper does not say how long one is.
2. The signals read exactly the rollouts the trainer learned from in the iteration (no extra rollouts); a task's
   success rate s_now is the mean over its rollouts in the iteration (`coevolve.signals`, which also pins down W, θ
   and the action patterns the paper leaves open).
3. When the signals flag more tasks than `synthesis.max_contexts`, the kinds take turns (forgetting, boundary,
   rare, forgetting, ...) so each kind that fired is explored (the paper does not say how it caps).
4. The offline default explores without an LLM (`OfflineExplorer`) and abstracts with templates
   (`TemplateAbstractor`); the paper uses an LLM for both (`synthesis.explorer: policy | llm`,
   `synthesis.abstractor: llm`).
5. Several groups per step are normalised by the step's token count (TRL's `dapo`), where the paper's J(θ) is
   per group (`coevolve.train`); held-out evaluation is greedy, one episode per task.
6. Admitted tasks join the pool for the next iteration's sample, drawn uniformly from D_t (`loop.synthetic_fraction`
   sets a share, `loop.signal_weights` weighs synthetic tasks by signal; `unexplored`: tasks made for a tool no
   rollout had called); the paper does not say how D_t is sampled. `loop.recur_fraction` gives a share of the
   sample to recently solved tasks: forgetting compares a task's rate with its own history, which a uniform sample
   of a pool hundreds of tasks large gives almost no task. `loop.sampler: history` (a STEERING switch) weighs each
   task by its own tries instead (`coevolve.curriculum`): never tried soon after admission, mixed outcomes
   favoured, mastered and failing tasks decaying but retested; metrics.jsonl's `draw` counts what each sample held.
7. `grpo.guidance: solution` (STEERING): a group whose K rollouts all fail on a task with a verified solution
   trains on that solution in place of one rollout, LUFFY-style off-policy guidance (`coevolve.guidance`); the
   signals, train success and the report read the policy's own rollouts only.
8. `signals.unexplored: true` (STEERING): rare also fires on a tool the iteration's tasks expose and no
   rollout called (the paper's rare needs c_p > 0); its exploration must call the tool and its abstraction keeps
   the shortest solutions that end in it (`coevolve.signals`, `coevolve.explore`, `coevolve.abstract`); with
   `signals.unexplored_orders` also on an ordered pair of tools no rollout made (validation: `order_free`).
9. `signals.unexplored_states: true` (STEERING): rare also fires on an action state (`tool@state`, the env's
   `states`: BFCL's working directory, other envs' arguments given) that D_{t-1}'s solutions and the iteration's
   rollouts reached fewer than `signals.rare_below` times; these contexts come before the kinds' turns of note 3;
   their exploration reaches the state first, on values it has observed, and abstraction keeps the shortest
   solution whose last call acts there (`coevolve.states`). `synthesis.rest_contexts: random` (off by default)
   explores random tasks instead of signal events after them, as many, so the three signals then steer no context.

The run directory:
    config.yaml          the resolved config
    metrics.jsonl        one line per iteration (0 = before training): train and held-out success, signal counts,
                         the synthesis summary (candidates, accepted, rejected by code, skipped), pool size by source,
                         seconds per phase (train, signals, synthesis, eval) and of the train phase by part
                         (`train_seconds`: rollout, loss, optimizer, logging, save, resume), the feedback share,
                         guided rollouts, synthesized tasks calling a tool D_0 never calls (`new_tool_tasks`),
                         what the sample held (`draw`), synthesized tasks reaching a state D_0 never reaches
                         (`state_tasks`)
    steps.jsonl          one line per optimizer step: TRL's loss/reward/KL/clip ratios + our rollout summary
    rollouts.jsonl       one line per trajectory trained on (iteration, step, calls, score, reasons, `guided`; no
                         token ids); with N processes each writes its share (rollouts.pI.jsonl for process I > 0)
    samples.jsonl        per iteration, the sample of D_{t-1} its slots stood for (samples.pI.jsonl likewise)
    heldout.jsonl        per evaluated iteration and held-out task: solved or not, the first failed check, the calls
    synthesis.jsonl      one line per candidate: signal -> flagged trajectories -> episode -> candidate -> verdict
    pool.sqlite          D_t for every t, with provenance and each task's success history
    checkpoints/         TRL checkpoints every run.save_steps and at every iteration's end
    final/               the trained model (or LoRA adapter) and tokenizer; summary.json; report.html
    run.log              the libraries' warnings and log records (the console keeps a progress bar and one line per
                         iteration)
Resume (`--resume`) after a kill redoes what the last metrics line does not cover, and nothing else
(`resume_plan`): steps after the last checkpoint train again with the same seeds; an iteration whose steps are
all checkpointed but whose metrics line is missing (a kill in its feedback) has phases 3-10 redone from its logged
rollouts: the pool refuses what it already holds and the lineage log replaces that iteration's lines; one committed
past the last complete checkpoint (`run.async_save`, killed mid-write) is redone whole.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from coevolve.config import Config
from coevolve.curriculum import CurriculumConfig, pool_draw_summary, pool_weights
from coevolve.envs.base import Env
from coevolve.explore import random_contexts
from coevolve.jsonl import JsonLines, atomic_write_text
from coevolve.metrics import IterationMetrics, RunResult
from coevolve.pool import BatchMix, TaskPool, recently_solved
from coevolve.records import SIGNAL_KINDS, ExplorationContext, Task, Trajectory
from coevolve.report import write_report
from coevolve.run_setup import (METRICS, Heldout, PhaseTimer, build_env, build_eval, build_renderer, check_heldout,
                                check_processes, env_check_warnings, exposed_tools, first_heldout, heldout_text,
                                last_heldout, load_tasks, new_tool_tasks, open_pool, policy_backend, pool_sizes,
                                process_state, resolve_config, resume_plan, run_logging, success_by, summary_of,
                                summary_table, write_run_config)
from coevolve.signals import SignalReport, extract_signals
from coevolve.train.trackers import report_iteration
from coevolve.states import new_state_tasks, state_coverage
from coevolve.synthesis import (Deadline, Stage, SynthesisResult, abstract, build_abstractor, build_explorer, explore,
                                signal_contexts, synthesis_result, validate)
from coevolve.train.calls import attach_trainer, settle_checkpoint
from coevolve.validate import Validator

if TYPE_CHECKING:
    from trl import GRPOTrainer

    from coevolve.train.calls import StepClock
    from coevolve.train.grpo import EnvRollouts

STEPS, ROLLOUTS, SAMPLES, LINEAGE, HELDOUT = (
    "steps.jsonl", "rollouts.jsonl", "samples.jsonl", "synthesis.jsonl", "heldout.jsonl")


# ===============================================================================================================
# The algorithm: one CoEvolve iteration, its phases numbered in the order they run
# ===============================================================================================================


def coevolve_iteration(run: "Run", t: int) -> IterationMetrics | None:
    """Iteration t: GRPO on a sample of D_{t-1}, then the feedback that makes D_t, then evaluation and the record."""
    timer, report, synthesis = PhaseTimer(), None, None
    with timer("train"):
        tasks = sample_tasks(run, t)
        trajectories = grpo_steps(run, t, tasks)
    if run.is_main:  # plumbing: with several processes, one runs the feedback and writes the pool and the files
        with timer("signals"):
            report = mine_signals(run, t, trajectories)
        with timer("synthesis"):
            contexts = choose_contexts(run, t, report, trajectories)
            deadline = Deadline.after(run.config.synthesis.time_budget_seconds)
            explored = explore_contexts(run, t, contexts, deadline)
            abstracted = abstract_episodes(run, t, explored, deadline)
            validated = validate_candidates(run, t, abstracted, deadline)
            synthesis = admit(run, t, contexts, explored, abstracted, validated)
    run.wait_for_everyone()
    with timer("eval"):
        heldout = evaluate_heldout(run, t)
    return (record_iteration(run, t, trajectories, report, synthesis, heldout, timer.seconds, tasks)
            if run.is_main else None)


def evaluate_before_training(run: "Run") -> IterationMetrics | None:
    """Iteration 0: the policy before any GRPO step, on the held-out set; D_0's size."""
    timer, heldout = PhaseTimer(), None
    if run.config.loop.eval_before_training or run.config.run.mode == "zero-shot":
        with timer("eval"):
            heldout = evaluate_heldout(run, 0)
    return record_iteration(run, 0, [], None, None, heldout, timer.seconds) if run.is_main else None


def sample_tasks(run: "Run", t: int) -> list[Task]:
    """1. The tasks of iteration t's slots: a seeded sample of D_{t-1} (the same on every resume), uniform or weighed
    by each task's own tries (`loop.sampler: history`, `coevolve.curriculum`). With the uniform draw a share
    (`loop.recur_fraction`) goes to tasks solved in one of their last W iterations, so that forgetting can fire."""
    loop, signals, seed = run.config.loop, run.config.signals, run.config.run.seed * 7_919 + t
    rng = random.Random(seed)
    recurring_ids = recently_solved(run.pool.histories(before=t, window=signals.window), signals.threshold,
                                    round(loop.recur_fraction * run.slots), rng) if loop.recur_fraction else []
    by_id = {task.id: task for task in run.pool.tasks_at(t - 1)} if recurring_ids else {}
    recurring = [by_id[task_id] for task_id in recurring_ids if task_id in by_id]
    weights: dict[str, float] = {}
    if loop.sampler == "history":
        weights = pool_weights(run.pool, t, CurriculumConfig.of(loop.curriculum), run.config.grpo.guidance != "off")
    weights.update(dict.fromkeys(recurring_ids, 0.0))  # weight 0: not drawn twice
    if loop.d0 == "explored":  # the env's own tasks only start explorations: never trained on
        weights.update(dict.fromkeys((task.id for task in run.pool.tasks_at(0, "seed")), 0.0))
    mix = BatchMix(loop.synthetic_fraction, loop.signal_weights)
    drawn = run.pool.sample(t - 1, run.slots - len(recurring), rng_seed=seed, config=mix, weights=weights)
    for kind in run.pool.idle_weights(t - 1, mix) if loop.signal_weights else ():  # nothing to weigh: said once
        run.note_once(f"loop.signal_weights.{kind} = {loop.signal_weights[kind]:g}: no task of D_{t - 1} comes from "
                      f"a `{kind}` context, so it weighed nothing in iteration {t}'s draw (it acts once one is admitted)")
    tasks = recurring + drawn
    if recurring:
        rng.shuffle(tasks)  # recurring tasks spread over the iteration's steps, not all in its first
    if not tasks and loop.d0 == "explored":
        from coevolve.train import TrainingError

        raise TrainingError("loop.d0: explored, but exploration admitted no task to train on; raise "
                            "loop.synthetic_contexts or synthesis.step_budget")
    return tasks or run.pool.tasks_at(t - 1)


def grpo_steps(run: "Run", t: int, tasks: Sequence[Task]) -> list[Trajectory]:
    """2. GRPO steps of iteration t on `tasks` (the trainer's slots stand for them), up to its last step; returns
    the trajectories they trained on, read back from rollouts.jsonl. Steps already in the last checkpoint are not
    trained again (a resumed run); their rollouts are in the log."""
    from coevolve.train import TrainingError
    from coevolve.train.calls import checkpoint_step, last_checkpoint, load_weights, train_steps

    first, last = run.step_range(t)
    checkpoint = last_checkpoint(run.directory)
    done = checkpoint_step(checkpoint) if checkpoint else 0
    if done < last:
        run.rollouts.assign_slots(tasks, t, run.slots)
        run.samples_log.rewrite(lambda row: row.get("iteration") != t)  # a resumed iteration draws the same sample
        run.samples_log.append({"iteration": t, "task_ids": [task.id for task in tasks]})
        reached = train_steps(run.trainer, run.directory, last, run.clock)
        if reached < last:  # TRL's epoch/step bookkeeping disagreeing with ours: never report steps not trained
            raise TrainingError(f"iteration {t} trained to step {reached}, not {last}; if resumed, the checkpoint's "
                                "trainer_state.json may not match this config (prompts_per_step, group_size, "
                                "loop.steps_per_iteration)")
    elif checkpoint is not None:
        load_weights(run.trainer, checkpoint)  # a redo after a kill: the phases below see the checkpoint's policy
    run.wait_for_everyone()  # every process's share of the rollouts is in its log
    # From the logs, never from memory: a normal iteration and its redo after a kill read the very same records;
    # the main process reads every process's share (the signals need whole groups).
    logs = run.all_rollout_logs() if run.is_main else [run.rollouts_log]
    trajectories = [Trajectory.from_dict({k: v for k, v in row.items() if k != "step"})
                    for log in logs for row in log.read() if row.get("iteration") == t]
    grpo = run.config.grpo  # the phase boundary: one batch of prompts_per_step x K per mu steps, whole groups
    expected = math.ceil((last - first + 1) / grpo.passes_per_batch) * grpo.prompts_per_step * run.group_size
    if run.is_main and len(trajectories) != expected:
        raise TrainingError(f"iteration {t}: the logs hold {len(trajectories)} rollouts, not steps x prompts_per_step "
                            f"x K = {expected}; rollouts.jsonl does not match this run's config")
    return trajectories


def mine_signals(run: "Run", t: int, trajectories: Sequence[Trajectory]) -> SignalReport:
    """3. Forgetting (against each task's history H_recent), boundary and rare signals of iteration t, from the
    policy's own rollouts (guided ones left out); its success rates join the history."""
    history = run.pool.histories(before=t, window=run.config.signals.window)
    own = [trajectory for trajectory in trajectories if not trajectory.guided]  # never a guided success
    tasks = run.tasks_before(t)
    exposed = exposed_tools(run.env, [tasks[i] for i in dict.fromkeys(tr.task_id for tr in own) if i in tasks]) \
        if run.config.signals.unexplored else None
    space, reached = (state_coverage(run.env, tasks.values(), own) if run.config.signals.unexplored_states
                      else (None, None))  # the action states each task could reach; c_p over D_{t-1} and `own`
    report = extract_signals(own, history, run.config.signals, t, exposed, space, reached)
    run.pool.record_success_rates(t, report.success_rates)
    return report


def choose_contexts(run: "Run", t: int, report: SignalReport, trajectories: Sequence[Trajectory]
                    ) -> list[ExplorationContext]:
    """4. What to explore: a context per signal event (coevolve), as many random tasks (random), or none."""
    mode, cap = run.config.run.mode, run.config.synthesis.max_contexts
    tasks = {task.id: task for task in run.pool.tasks_at(t - 1)}
    if mode == "coevolve":
        return signal_contexts(report.events, tasks, {tr.id: tr for tr in trajectories}, cap,
                               run.config.synthesis.rest_contexts, t, run.config.run.seed)
    if mode == "random":  # the same budget as the signals would have spent, without their steering
        return random_contexts(list(tasks.values()), min(len(report.events), cap), t, run.config.run.seed)
    return []


def explore_contexts(run: "Run", t: int, contexts: Sequence[ExplorationContext], deadline: Deadline) -> Stage:
    """5. One or more fresh episodes in the env from each context's task, with the signal's evidence."""
    if not contexts:
        return Stage((), {}, 0.0)
    with run.explorer() as explorer:
        return explore(run.env, contexts, run.tasks_before(t), explorer, run.config.run.seed + t, deadline)


def abstract_episodes(run: "Run", t: int, explored: Stage, deadline: Deadline) -> Stage:
    """6. Candidate tasks (intent, query, solution) from the episodes' successful calls."""
    return abstract(run.env, explored.items, run.tasks_before(t), run.abstractor, deadline)


def validate_candidates(run: "Run", t: int, abstracted: Stage, deadline: Deadline) -> Stage:
    """7. Every candidate executed in a fresh episode and checked; a verdict with reasons for each."""
    if not abstracted.items:
        return Stage((), {}, 0.0)
    heldout = () if run.config.loop.allow_heldout_overlap else run.eval_tasks  # D_t never holds a held-out task
    validator = Validator(run.env, run.config.synthesis.validation(), known=run.pool.tasks_at(max(t - 1, 0)),
                          heldout=heldout)
    return validate(abstracted.items, validator, t, deadline)


def admit(run: "Run", t: int, contexts: Sequence[ExplorationContext], explored: Stage, abstracted: Stage,
          validated: Stage) -> SynthesisResult | None:
    """8. D_t = D_{t-1} ∪ the accepted candidates, with their lineage (once: the pool refuses what it holds).
    None when nothing was explored (static mode, no signal)."""
    run.pool.start_iteration(t)
    if not contexts:
        return None
    result = synthesis_result(t, contexts, explored, abstracted, validated)
    run.lineage_log.rewrite(lambda row: row.get("iteration") != t)  # a redone iteration replaces its rows
    run.lineage_log.extend(result.lineage())
    run.pool.add_tasks(result.admitted, t)
    return result


def evaluate_heldout(run: "Run", t: int) -> Heldout | None:
    """9. Greedy success on the held-out tasks, every `loop.eval_every` iterations and after the last. With several
    processes each evaluates every N-th task and the main process gathers the results."""
    every = run.config.loop.eval_every
    if not (t == run.iterations or t == 0 or (every and t % every == 0)):
        return None
    from accelerate import PartialState
    from accelerate.utils import gather_object
    from coevolve.evaluate import evaluate_model
    from coevolve.policy.backends import SamplingConfig
    from tqdm.auto import tqdm

    process = PartialState()
    shard = list(run.eval_tasks)[process.process_index::process.num_processes]
    greedy = replace(run.config.rollout.engine(), group_size=1, sampling=SamplingConfig(temperature=0.0, seed=0))
    with run.generation() as backend, tqdm(total=len(shard), desc="held-out eval", unit="task", leave=False,
                                           disable=not run.is_main) as bar:
        report, batch = evaluate_model(run.eval_env, shard, backend, run.renderer, greedy, "model",
                                       progress=lambda finished, total: bar.update(finished - bar.n))
    truths = {task.id: task.truth_tools for task in shard}
    rows = [{"iteration": t, "task_id": trajectory.task_id, "name": result.name, "success": result.score.success,
             "truth_calls": len(truths[trajectory.task_id]),
             "truth_tools": [name[:60] for name in truths[trajectory.task_id]],
             "reason": (result.score.reasons or ("",))[0][:300],
             "calls": [step.action[:200] for step in trajectory.steps]}
            for result, trajectory in zip(report.results, batch.trajectories)]
    if process.num_processes > 1:
        rows = gather_object(rows)
    if run.is_main:  # per task, so the report can say which tasks training fixed and which it broke
        run.heldout_log.rewrite(lambda row: row.get("iteration") != t)
        run.heldout_log.extend(rows)
    return Heldout(sum(row["success"] for row in rows) / len(rows) if rows else 0.0,
                   success_by(rows, lambda row: str(row["truth_calls"])),
                   success_by(rows, lambda row: "seen" if set(row["truth_tools"]) <= run.seed_tools else "unseen"))


def record_iteration(run: "Run", t: int, trajectories: Sequence[Trajectory], report: SignalReport | None,
                     synthesis: SynthesisResult | None, evaluated: Heldout | None,
                     seconds: Mapping[str, float], tasks: Sequence[Task] = ()) -> IterationMetrics:
    """10. The iteration's line of metrics.jsonl: its commit point (a resume redoes an iteration without one)."""
    seconds = {phase: round(seconds.get(phase, 0.0), 3) for phase in ("train", "signals", "synthesis", "eval")}
    feedback = seconds["signals"] + seconds["synthesis"]
    heldout = evaluated.success if evaluated is not None else None
    own = [tr for tr in trajectories if not tr.guided]  # the policy's success, not the solutions it was shown
    metrics = IterationMetrics(
        t, run.step_range(t) if t else None, sum(tr.score >= 1.0 for tr in own) / len(own) if own else None, heldout,
        {kind: report.count(kind) if report is not None else 0 for kind in SIGNAL_KINDS},
        synthesis.summary() if synthesis is not None else {}, pool_sizes(run.pool, t),
        {cause: sum(1 for tr in trajectories if (tr.failure or "").startswith(cause + ":"))
         for cause in ("backend", "environment")}, seconds,
        round(feedback / max(1e-9, sum(seconds.values())), 4) if t else 0.0,
        evaluated.by_calls if evaluated is not None else {},
        evaluated.by_tools if evaluated is not None else {},
        report.pattern_summary() if report is not None else {},
        run.clock.take() if run.clock is not None and t else {},
        len(trajectories) - len(own), new_tool_tasks(run.pool, t, run.seed_tools),
        pool_draw_summary(run.pool, t, [task.id for task in tasks], [tr.task_id for tr in own],
                          CurriculumConfig.of(run.config.loop.curriculum).window).to_dict() if t else {},
        new_state_tasks(run.env.states, run.pool.tasks_at(0, "seed"), run.pool.tasks_at(t, "synthetic")) if t else {},
    )
    run.metrics_log.append(metrics.to_dict())  # under run.async_save its checkpoint may still be in flight
    report_iteration(run.trainer, metrics.to_dict(), run.directory)  # after the line; never twice
    if t == 0:
        if heldout is not None:
            run.say(f"before training: held-out success {heldout_text(metrics)} on {len(run.eval_tasks)} tasks")
        return metrics
    run.say(f"iteration {t}: train success {metrics.train_success or 0:.2f}, held-out {heldout_text(metrics)}, "
            f"signals {dict(metrics.signals)}, accepted {metrics.synthesis.get('accepted', 0)}, pool "
            f"{metrics.pool['total']}, feedback share {metrics.feedback_share:.1%}")
    return metrics


# ===============================================================================================================
# Plumbing: what the phases share, the run directory, D_0, the prompt, the trainer, resume
# ===============================================================================================================


@dataclass
class Run:
    """What the phases of a run share: the config, the env and held-out set, the pool, the trainer, the logs."""

    config: Config
    directory: Path
    env: Env
    renderer: Any
    pool: TaskPool
    eval_env: Env
    eval_tasks: list[Task]
    say: Callable[[str], None]
    is_main: bool = True
    num_processes: int = 1
    trainer: "GRPOTrainer | None" = None
    """TRL's trainer (`coevolve.train.grpo`'s subclass), set by `coevolve.train.calls.attach_trainer` alone; None in
    mode zero-shot."""
    rollouts: "EnvRollouts | None" = None
    """The trainer's rollout function (`coevolve.train.EnvRollouts`): its slots say which task each row is."""
    backend: Any = None
    """A fixed generation backend (tests, benchmarks, mode zero-shot), else the model being trained."""
    abstractor: Any = None
    offline_explorer: Any = None
    clock: "StepClock | None" = None
    """Where the train phase's seconds go (`coevolve.train.calls.StepClock`)."""

    def __post_init__(self) -> None:
        loop = self.config.loop
        self.steps_per_iteration = loop.steps_per_iteration
        self.group_size = self.config.rollout.group_size  # K, the rollouts of one task in one step: said once
        self.slots = self.config.grpo.prompts_per_step * loop.steps_per_iteration // self.config.grpo.passes_per_batch
        self.iterations = math.ceil(self.config.run.max_steps / loop.steps_per_iteration)
        self.metrics_log = JsonLines(self.directory / METRICS)
        self.noted: set[str] = set()
        self.lineage_log = JsonLines(self.directory / LINEAGE)
        self.steps_log = JsonLines(self.directory / STEPS)
        self.heldout_log = JsonLines(self.directory / HELDOUT)
        from accelerate import PartialState

        index = PartialState().process_index
        self.rollouts_log = JsonLines(self.directory / (f"rollouts.p{index}.jsonl" if index else ROLLOUTS))
        self.samples_log = JsonLines(self.directory / (f"samples.p{index}.jsonl" if index else SAMPLES))
        self.abstractor = build_abstractor(self.config.synthesis)
        if self.config.synthesis.explorer != "policy":
            self.offline_explorer = build_explorer(self.config.synthesis)

    @cached_property
    def seed_tools(self) -> set[str]:
        """The tools some task of D_0 calls (D_0 never changes during a run)."""
        return {name for task in self.pool.tasks_at(0, source="seed") for name in task.truth_tools}

    def step_range(self, t: int) -> tuple[int, int]:
        """First and last optimizer step of iteration t (the last iteration may be shorter)."""
        return (t - 1) * self.steps_per_iteration + 1, min(t * self.steps_per_iteration, self.config.run.max_steps)

    def note_once(self, text: str) -> None:
        """A note said once a run, on the console and in run.log (e.g. a switch that changes nothing)."""
        if text.split(":", 1)[0] not in self.noted:
            self.noted.add(text.split(":", 1)[0])
            self.say(f"note: {text}")
            logging.getLogger("coevolve.loop").warning(text)

    def all_rollout_logs(self) -> list[JsonLines]:
        """Every process's rollout log, process 0 first."""
        return [JsonLines(self.directory / ROLLOUTS)] + [
            JsonLines(self.directory / f"rollouts.p{index}.jsonl") for index in range(1, self.num_processes)]

    def wait_for_everyone(self) -> None:
        if self.num_processes > 1:
            from accelerate import PartialState

            PartialState().wait_for_everyone()

    def tasks_before(self, t: int) -> dict[str, Task]:
        return {task.id: task for task in self.pool.tasks_at(max(t - 1, 0))}

    @contextmanager
    def generation(self) -> Iterator[Any]:
        """The backend over the current policy (the model being trained, or the fixed one)."""
        if self.backend is not None or self.rollouts is None:
            yield self.backend if self.backend is not None else policy_backend(self.config, self.renderer.tokenizer)
            return
        with self.rollouts.generation_backend(self.trainer) as backend:
            yield backend

    @contextmanager
    def explorer(self) -> Iterator[Any]:
        """The explorer `synthesis.explorer` names; `policy` explores with the model being trained, as it is now."""
        if self.offline_explorer is not None:
            yield self.offline_explorer
            return
        with self.generation() as backend:
            yield build_explorer(self.config.synthesis, backend, self.renderer)


def synthesize_before_training(run: Run) -> None:
    """Mode synthetic: one synthesis pass over random contexts of D_0 before training; the admitted tasks join D_0.
    Once: a resume after the pass admitted its tasks (a kill in the evaluation that follows) finds them there."""
    if run.pool.tasks_at(0, source="synthetic"):
        return
    contexts = random_contexts(run.pool.tasks_at(0), run.config.loop.synthetic_contexts, 0, run.config.run.seed)
    deadline = Deadline.after(run.config.synthesis.time_budget_seconds)
    explored = explore_contexts(run, 0, contexts, deadline)
    abstracted = abstract_episodes(run, 0, explored, deadline)
    validated = validate_candidates(run, 0, abstracted, deadline)
    result = admit(run, 0, contexts, explored, abstracted, validated)  # None when there was nothing to explore
    admitted, candidates = (len(result.admitted), len(result.candidates)) if result else (0, 0)
    run.say(f"synthesis before training: {admitted} tasks admitted of {candidates}")


# ===============================================================================================================
# The run
# ===============================================================================================================


def run(config_path: str | None, overrides: Sequence[str] = (), output_dir: str | None = None,
        resume: bool = False, backend: Any = None, say: Callable[[str], None] = print) -> RunResult:
    """A whole run: set-up, iteration 0's evaluation, iterations 1..T (`coevolve_iteration`), the final model."""
    from coevolve.run_lock import RunLock

    started = time.perf_counter()
    config, directory = resolve_config(config_path, overrides, output_dir, resume)
    process = process_state(config)
    if say is print:  # lines between the progress bar's redraws
        from tqdm.auto import tqdm

        say = tqdm.write
    say = say if process.is_main_process else (lambda text: None)  # one voice for N processes
    check_processes(config, process.num_processes, deepspeed=process.distributed_type.name == "DEEPSPEED")
    env = build_env(config)
    seed_tasks = load_tasks(config, env)
    eval_env, eval_tasks = build_eval(config, env)
    if config.run.mode != "zero-shot" and config.loop.d0 == "entries":  # before anything is written; zero-shot
        check_heldout(config, seed_tasks, eval_tasks)                        # and explored D_0 train on no entry
    # One writer per run directory, from before its first write to the end (`coevolve.run_lock`).
    with RunLock(directory, enabled=process.is_main_process):
        write_run_config(config, directory, process.is_main_process)
        with run_logging(directory):  # library warnings and TRL's per-step dicts go to run.log, not the screen
            return _run(config, directory, process, started, resume, backend, say,
                        (env, seed_tasks, eval_env, eval_tasks))


def _run(config: Config, directory: Path, process: Any, started: float, resume: bool, backend: Any,
         say: Callable[[str], None], envs: tuple[Env, list[Task], Env, list[Task]]) -> RunResult:
    env, seed_tasks, eval_env, eval_tasks = envs
    tokenizer, renderer, tasks = build_renderer(config, env, seed_tasks)
    say(f"run {directory}: mode {config.run.mode}, {len(tasks)} tasks, model {config.model.name}, "
        f"{config.run.max_steps} steps of {config.grpo.prompts_per_step} tasks x {config.rollout.group_size} rollouts "
        f"in iterations of {config.loop.steps_per_iteration}; held-out: {len(eval_tasks)} tasks")
    for line in env_check_warnings(env, seed_tasks) if process.is_main_process else ():
        say(f"warning: {line}")  # a user env `env check` would refuse: said once, the run goes on
    with open_pool(directory, tasks) as pool:
        state = Run(config, directory, env, renderer, pool, eval_env, eval_tasks, say, is_main=process.is_main_process,
                    num_processes=process.num_processes, backend=backend)
        plan = resume_plan(state, resume)
        if config.run.mode != "zero-shot":
            attach_trainer(state, tokenizer)
        explored = config.loop.d0 == "explored" and config.run.mode != "zero-shot"
        if state.is_main and (config.run.mode == "synthetic" or explored) and not plan.baseline_done:
            synthesize_before_training(state)
        if explored:  # D_0 is what exploration admitted: it must hold tasks, none of them held out
            check_heldout(config, pool.tasks_at(0, source="synthetic"), eval_tasks)
        process.wait_for_everyone()
        if not plan.baseline_done:
            evaluate_before_training(state)  # iteration 0's line; without its evaluation under eval_before_training: false
        final = plan.checkpoint_step
        if config.run.mode != "zero-shot":
            if plan.first_iteration > state.iterations:
                say(f"nothing to train: the last checkpoint is at step {final} = run.max_steps; raise run.max_steps "
                    "to continue")
            for t in range(plan.first_iteration, state.iterations + 1):
                coevolve_iteration(state, t)
                process.wait_for_everyone()  # the next sample reads the pool the main process just wrote
            final = max(final, state.trainer.state.global_step)
            if final > plan.checkpoint_step:
                say(f"trained steps {plan.checkpoint_step + 1}..{final}")
            save_final(state, tokenizer)
        records = state.metrics_log.read()
        if config.grpo.guidance != "off" and state.is_main and not any(r.get("guided") for r in records):
            state.note_once("grpo.guidance: no group was guided in this run (every group had a success or no "
                            "solution), so the switch changed nothing")
        sizes = pool_sizes(pool, pool.latest_iteration() or 0)
    result = RunResult(directory, plan.checkpoint_step, final, time.perf_counter() - started, first_heldout(records),
                       last_heldout(records))
    if not state.is_main:
        return result
    summary = summary_of(config, records, sizes, final, plan.checkpoint_step, result.seconds)
    atomic_write_text(directory / "summary.json", json.dumps(summary, indent=2) + "\n")
    report = write_report(directory)
    say(summary_table(summary) + f"\nreport: {report}")
    return result


def save_final(run: Run, tokenizer: Any) -> None:
    from coevolve.train.calls import last_checkpoint, load_weights

    final_dir = run.directory / "final"
    if run.trainer.state.global_step == 0:  # a finished run resumed with nothing to train
        checkpoint = last_checkpoint(run.directory)
        if final_dir.exists() or checkpoint is None:
            return
        load_weights(run.trainer, checkpoint)
    run.trainer.save_model(str(final_dir))  # collective under DeepSpeed/FSDP; writes from the main process only
    settle_checkpoint(run.trainer)  # run.async_save: the last checkpoint, written beside final/, is complete
    if run.is_main:
        tokenizer.save_pretrained(str(final_dir))
