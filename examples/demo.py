"""The main job: DQN on gymnasium's CartPole-v1 with prioritized and with uniform replay, on CPU.

Built from tdreplay pieces: a ``TensorDictPrioritizedReplayBuffer`` (or, for the comparison, a
``TensorDictReplayBuffer`` sampling uniformly) over a ``LazyTensorStorage``, fed and sampled by
``ReplayBufferTrainer`` hooks inside a ``Trainer``. With prioritized replay the loss weights
each sample's TD error by its importance weight (``priority_weight``) and returns ``td_error``
as its new priority.

By default every seed (0, 1 and 2) is trained twice, with prioritized (PER) and with uniform
replay, and both learning curves go into one plot: what prioritized replay buys is the gap
between them. The greedy policy is evaluated every ``--eval-interval`` environment steps and
each run stops at exactly ``--steps`` steps. A progress bar shows each run on a terminal (a
progress line every 10 % otherwise, e.g. under ``nox``). At the end it writes
``<out>/returns.png`` (return against environment steps, one curve per replay kind) and
``<out>/summary.json``; each run saves its trainer (networks, optimizer, counters, evaluation
history) and replay buffer in ``<out>/<sampler>-seed<seed>/checkpoint``. ``--resume`` continues
every run from its checkpoint for ``--steps`` more steps.

Usage::

    nox -s demo                                     # or: python examples/demo.py
    nox -s demo -- --seeds 0 --steps 10000          # a quick look
    nox -s demo -- --sampler prioritized            # one replay kind only
    nox -s demo -- --resume --steps 10000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dqn_cartpole import (  # noqa: E402
    AnnealBeta,
    DQNLoss,
    EpsilonGreedyCollector,
    Evaluator,
    HardUpdate,
    ReplayRatio,
    TrainingReturnLog,
    make_qnet,
)

from tdreplay.data import (  # noqa: E402
    CheckpointError,
    LazyTensorStorage,
    RandomSampler,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)
from tdreplay.trainers import ReplayBufferTrainer, Trainer  # noqa: E402

CHECKPOINT = "checkpoint"


SAMPLERS = ("prioritized", "uniform")
#: environment frames per collected batch and optimisation steps per frame (128 per 256 frames)
FRAMES_PER_BATCH = 256
OPTIM_STEPS_PER_FRAME = 0.5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=20_000,
                        help="environment steps of each run (more steps when resuming)")
    parser.add_argument("--seeds", "--seed", type=int, nargs="+", default=[0, 1, 2], dest="seeds",
                        help="seeds of the runs (networks, sampling, environments); every "
                             "replay kind runs every seed")
    parser.add_argument("--buffer-size", type=int, default=50_000, help="replay buffer capacity")
    parser.add_argument("--sampler", choices=(*SAMPLERS, "both"), default="both",
                        help="replay sampling: proportional prioritized (PER), uniform, or both "
                             "(the same seeds with each, compared in one plot)")
    parser.add_argument("--compare", action="store_const", const="both", dest="sampler",
                        help="same as --sampler both")
    parser.add_argument("--out", type=Path, default=Path("demo_output"), help="output directory")
    parser.add_argument("--resume", action="store_true",
                        help="continue every run from its checkpoint in <out> (step count, "
                             "networks, buffer)")
    parser.add_argument("--eval-interval", type=int, default=2_000,
                        help="environment steps between two evaluations")
    parser.add_argument("--eval-episodes", type=int, default=10,
                        help="greedy episodes per evaluation")
    parser.add_argument("--batch-size", type=int, default=64, help="sampled batch size")
    parser.add_argument("--lr", type=float, default=2.3e-3, help="Adam learning rate")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (small networks are fastest on one)")
    parser.add_argument("--progress", choices=("auto", "bar", "lines", "none"), default="auto",
                        help="progress of each run: a tqdm bar, a line every 10%%, or nothing "
                             "(auto: a bar on a terminal, lines otherwise)")
    args = parser.parse_args(argv)
    for name in ("steps", "buffer_size", "eval_interval", "eval_episodes", "batch_size",
                 "threads"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds must be distinct, got {args.seeds}")
    args.samplers = list(SAMPLERS) if args.sampler == "both" else [args.sampler]
    if args.progress == "auto":
        args.progress = "bar" if sys.stderr.isatty() else "lines"
    return args


@dataclass
class Run:
    """Everything one run builds, so tests can look inside."""

    sampler: str
    seed: int
    out: Path
    trainer: Trainer
    replay_buffer: TensorDictReplayBuffer
    collector: EpsilonGreedyCollector
    evaluator: Evaluator
    loss: DQNLoss


def make_replay_buffer(kind: str, size: int, batch_size: int) -> TensorDictReplayBuffer:
    storage = LazyTensorStorage(size)
    if kind == "prioritized":
        return TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, priority_key="td_error",
                                                 storage=storage, batch_size=batch_size)
    return TensorDictReplayBuffer(storage=storage, sampler=RandomSampler(),
                                  batch_size=batch_size)


def run_dir(out: Path, sampler: str, seed: int) -> Path:
    return out / f"{sampler}-seed{seed}"


def build(args: argparse.Namespace, sampler: str, seed: int) -> Run:
    """Networks, collector, buffer and trainer of one run with all hooks registered.

    The schedule follows a well-tested CartPole DQN recipe: collect 256 steps (8 environments x
    32 steps), then 128 optimisation steps on batches of 64 against a target network frozen for
    the round (``HardUpdate`` at ``pre_optim_steps``); epsilon decays from 1 to 0.04 over the
    first 8k steps. A batch ends early at an evaluation and at the end of the run (so both
    happen at exactly the requested step), with optimisation steps in proportion.
    """
    torch.manual_seed(seed)
    out = run_dir(args.out, sampler, seed)
    qnet = make_qnet(hidden=256)
    loss = DQNLoss(qnet, gamma=0.99)
    collector = EpsilonGreedyCollector(qnet, num_envs=8, frames_per_batch=FRAMES_PER_BATCH,
                                       init_random_frames=1_000, eps_end=0.04,
                                       eps_decay_frames=8_000, seed=seed)
    trainer = Trainer(
        collector=collector,
        total_frames=args.steps,
        optim_steps_per_batch=round(FRAMES_PER_BATCH * OPTIM_STEPS_PER_FRAME),
        loss_module=loss,
        optimizer=torch.optim.Adam(qnet.parameters(), lr=args.lr, foreach=True),
        clip_norm=10.0,
        progress_bar=args.progress == "bar",
        seed=seed,
        save_trainer_interval=10_000,
        log_interval=1_000,
        save_trainer_file=out / CHECKPOINT,
    )
    replay_buffer = make_replay_buffer(sampler, args.buffer_size, args.batch_size)
    trainer.register_op("batch_process", ReplayRatio(trainer, OPTIM_STEPS_PER_FRAME))
    ReplayBufferTrainer(replay_buffer, flatten_tensordicts=True).register(trainer)
    HardUpdate(loss).register(trainer)
    evaluator = Evaluator(qnet, interval=args.eval_interval, episodes=args.eval_episodes,
                          seed=10_000 + seed)
    evaluator.register(trainer)
    # batches end at the next evaluation and at the last step
    collector.stop_at = lambda: min(evaluator.next_at, trainer.total_frames)
    trainer.register_op("pre_steps_log", TrainingReturnLog(collector))
    if sampler == "prioritized":
        trainer.register_op("post_steps", AnnealBeta(trainer, replay_buffer.sampler,
                                                     frames=30_000))
    return Run(sampler, seed, out, trainer, replay_buffer, collector, evaluator, loss)


class ProgressLines:
    """``post_steps`` op: one progress line each time a run passes another 10 % of its steps
    (the progress bar's stand-in when the output is not a terminal, e.g. under nox or CI)."""

    def __init__(self, trainer: Trainer, label: str, start: int,
                 write: Callable[[str], None] = print) -> None:
        self.trainer, self.label, self.start, self.write = trainer, label, start, write
        self.began = time.perf_counter()
        self._next_tenth = 1

    def __call__(self) -> None:
        total = self.trainer.total_frames - self.start
        done = self.trainer.collected_frames - self.start
        if total <= 0 or done * 10 < self._next_tenth * total:
            return
        self._next_tenth = done * 10 // total + 1
        elapsed = time.perf_counter() - self.began
        left = elapsed * (total - done) / max(done, 1)
        self.write(f"[{self.label}] {self.trainer.collected_frames:,}/"
                   f"{self.trainer.total_frames:,} steps ({100 * done // total}%), "
                   f"{elapsed:.0f} s elapsed, ~{left:.0f} s left")


def plot(runs: list[dict[str, Any]], path: Path, title: str) -> None:
    """Evaluation return against environment steps: one curve per replay kind (the mean over
    the seeds, with each seed as a thin line when there are several), in one figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"prioritized": "tab:blue", "uniform": "tab:orange"}
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for sampler in [s for s in SAMPLERS if any(r["sampler"] == s for r in runs)]:
        mine = [r for r in runs if r["sampler"] == sampler]
        color = colors[sampler]
        by_frame: dict[int, list[float]] = {}
        for r in mine:
            for frames, value in r["history"]:
                by_frame.setdefault(int(frames), []).append(float(value))
            if len(mine) > 1:
                ax.plot([f for f, _ in r["history"]], [v for _, v in r["history"]],
                        color=color, alpha=0.3, linewidth=0.8)
        frames = sorted(by_frame)
        mean = [sum(by_frame[f]) / len(by_frame[f]) for f in frames]
        seeds = ", ".join(str(r["seed"]) for r in mine)
        what = "mean of seeds" if len(mine) > 1 else "seed"
        ax.plot(frames, mean, marker="o", markersize=3, color=color,
                label=f"{sampler} replay ({what} {seeds})")
        for r in mine:
            if r["resumed_at"] is not None:
                ax.axvline(r["resumed_at"], color="grey", linestyle="--", linewidth=1)
    ax.axhline(500, color="grey", linestyle=":", linewidth=1, label="max return (500)")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("evaluation return (greedy policy)")
    ax.set_title(title)
    ax.set_ylim(0, 580)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", ncol=3, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def train_one(args: argparse.Namespace, sampler: str, seed: int, label: str) -> dict[str, Any]:
    """Build (or resume) one run, train it and return its summary (with the ``Run``)."""
    run = build(args, sampler, seed)
    trainer = run.trainer
    resumed_at = None
    if args.resume:
        checkpoint = run.out / CHECKPOINT
        if not checkpoint.exists():
            raise SystemExit(f"--resume: no checkpoint at {checkpoint} (run once without "
                             f"--resume first, with the same --sampler and --seeds).")
        try:
            trainer.load_from_file(checkpoint)
        except CheckpointError as err:
            raise SystemExit(f"--resume: cannot load {checkpoint}: {err} (resume with the "
                             f"--buffer-size of the saved run)") from err
        resumed_at = trainer.collected_frames
        trainer.total_frames = resumed_at + args.steps
        print(f"[{label}] resumed from {checkpoint}: {resumed_at} steps done, buffer holds "
              f"{len(run.replay_buffer)} transitions (write count "
              f"{run.replay_buffer.write_count})", flush=True)
    if args.progress == "lines":
        trainer.register_op("post_steps", ProgressLines(trainer, label, trainer.collected_frames))
    print(f"[{label}] DQN on CartPole-v1, {sampler} replay, seed {seed}: steps "
          f"{trainer.collected_frames:,} to {trainer.total_frames:,}, evaluation every "
          f"{args.eval_interval:,}", flush=True)

    start = time.perf_counter()
    trainer.train()  # evaluates after the last batch, then saves the checkpoint
    wall = time.perf_counter() - start
    history = run.evaluator.history
    summary = {
        "sampler": sampler,
        "seed": seed,
        "steps": trainer.collected_frames,
        "optim_steps": trainer.optim_count,
        "resumed_at": resumed_at,
        "final_eval_return": history[-1][1],
        "best_eval_return": run.evaluator.best,
        "wall_time_s": round(wall, 1),
        "buffer_len": len(run.replay_buffer),
        "buffer_write_count": run.replay_buffer.write_count,
        "history": history,
        "checkpoint": str(run.out / CHECKPOINT),
    }
    print(f"[{label}] done: {trainer.collected_frames:,} steps, {trainer.optim_count:,} "
          f"optimisation steps in {wall:.0f} s; final eval return "
          f"{summary['final_eval_return']:.1f}, best {run.evaluator.best:.1f}", flush=True)
    return {**summary, "run": run}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    plan = [(sampler, seed) for seed in args.seeds for sampler in args.samplers]
    start = time.perf_counter()
    runs = []
    for i, (sampler, seed) in enumerate(plan, 1):
        label = f"run {i}/{len(plan)}: {sampler}, seed {seed}"
        runs.append(train_one(args, sampler, seed, label))
    wall = time.perf_counter() - start

    plain = [{k: v for k, v in r.items() if k != "run"} for r in runs]
    kinds = " vs ".join(args.samplers)
    seeds = ", ".join(map(str, args.seeds))
    plot(plain, args.out / "returns.png",
         f"DQN on CartPole-v1: {kinds} replay (seed{'s' if len(args.seeds) > 1 else ''} "
         f"{seeds})")
    summary = {"samplers": args.samplers, "seeds": args.seeds, "eval_interval": args.eval_interval,
               "wall_time_s": round(wall, 1), "runs": plain}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\n{'replay':<12} {'seed':>4} {'final':>7} {'best':>7} {'mean of evals':>14}")
    for r in plain:
        values = [v for _, v in r["history"]]
        print(f"{r['sampler']:<12} {r['seed']:>4} {r['final_eval_return']:>7.1f} "
              f"{r['best_eval_return']:>7.1f} {sum(values) / len(values):>14.1f}")
    print(f"{len(runs)} run(s) in {wall:.0f} s; wrote {args.out / 'returns.png'}, "
          f"{args.out / 'summary.json'} and the checkpoints under {args.out}", flush=True)
    summary["runs"] = runs
    return summary


if __name__ == "__main__":
    main()
