"""The main job: DQN with prioritized replay on gymnasium's CartPole-v1, on CPU.

Built from tdreplay pieces: a ``TensorDictPrioritizedReplayBuffer`` over a ``LazyTensorStorage``,
fed and sampled by ``ReplayBufferTrainer`` hooks inside a ``Trainer``. The loss weights each
sample's TD error by its importance weight (``priority_weight``) and returns ``td_error`` as its
new priority.

As it trains it prints the greedy policy's evaluation return; at the end it writes
``<out>/returns.png`` (return against environment steps) and ``<out>/summary.json``, and the
trainer (networks, optimizer, counters, evaluation history) and the replay buffer are saved in
``<out>/checkpoint``. ``--resume`` continues from that checkpoint for ``--steps`` more steps.

Usage::

    nox -s demo                          # or: python examples/demo.py
    nox -s demo -- --steps 20000 --sampler uniform
    nox -s demo -- --resume --steps 10000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=30_000,
                        help="environment steps to run (more steps when resuming)")
    parser.add_argument("--seed", type=int, default=0, help="seeds networks, sampling, envs")
    parser.add_argument("--buffer-size", type=int, default=50_000, help="replay buffer capacity")
    parser.add_argument("--sampler", choices=("prioritized", "uniform"), default="prioritized",
                        help="replay sampling: proportional prioritized (PER) or uniform")
    parser.add_argument("--out", type=Path, default=Path("demo_output"), help="output directory")
    parser.add_argument("--resume", action="store_true",
                        help="continue from <out>/checkpoint (step count, networks, buffer)")
    parser.add_argument("--eval-interval", type=int, default=2_500,
                        help="environment steps between two evaluations")
    parser.add_argument("--eval-episodes", type=int, default=10,
                        help="greedy episodes per evaluation")
    parser.add_argument("--batch-size", type=int, default=64, help="sampled batch size")
    parser.add_argument("--lr", type=float, default=2.3e-3, help="Adam learning rate")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (small networks are fastest on one)")
    args = parser.parse_args(argv)
    for name in ("steps", "buffer_size", "eval_interval", "eval_episodes", "batch_size",
                 "threads"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    return args


@dataclass
class Run:
    """Everything the demo builds, so tests can look inside."""

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


def build(args: argparse.Namespace) -> Run:
    """Networks, collector, buffer and trainer with all hooks registered.

    The schedule follows a well-tested CartPole DQN recipe: collect 256 steps (8 environments x
    32 steps), then 128 optimisation steps on batches of 64 against a target network frozen for
    the round (``HardUpdate`` at ``pre_optim_steps``); epsilon decays from 1 to 0.04 over the
    first 8k steps.
    """
    torch.manual_seed(args.seed)
    qnet = make_qnet(hidden=256)
    loss = DQNLoss(qnet, gamma=0.99)
    collector = EpsilonGreedyCollector(qnet, num_envs=8, frames_per_batch=256,
                                       init_random_frames=1_000, eps_end=0.04,
                                       eps_decay_frames=8_000, seed=args.seed)
    trainer = Trainer(
        collector=collector,
        total_frames=args.steps,
        optim_steps_per_batch=128,
        loss_module=loss,
        optimizer=torch.optim.Adam(qnet.parameters(), lr=args.lr, foreach=True),
        clip_norm=10.0,
        progress_bar=sys.stderr.isatty(),
        seed=args.seed,
        save_trainer_interval=10_000,
        log_interval=1_000,
        save_trainer_file=args.out / CHECKPOINT,
    )
    replay_buffer = make_replay_buffer(args.sampler, args.buffer_size, args.batch_size)
    ReplayBufferTrainer(replay_buffer, flatten_tensordicts=True).register(trainer)
    HardUpdate(loss).register(trainer)
    evaluator = Evaluator(qnet, interval=args.eval_interval, episodes=args.eval_episodes,
                          seed=10_000 + args.seed)
    evaluator.register(trainer)
    trainer.register_op("pre_steps_log", TrainingReturnLog(collector))
    if args.sampler == "prioritized":
        trainer.register_op("post_steps", AnnealBeta(trainer, replay_buffer.sampler,
                                                     frames=30_000))
    return Run(trainer, replay_buffer, collector, evaluator, loss)


def plot(history: list[tuple[int, float]], resumed_at: int | None, path: Path,
         title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    frames = [f for f, _ in history]
    returns = [r for _, r in history]
    ax.plot(frames, returns, marker="o", markersize=3)
    ax.axhline(500, color="grey", linestyle=":", linewidth=1, label="max return (500)")
    if resumed_at is not None:
        ax.axvline(resumed_at, color="tab:red", linestyle="--", linewidth=1, label="resumed")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("evaluation return (greedy policy)")
    ax.set_title(title)
    ax.set_ylim(0, 520)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    run = build(args)
    trainer = run.trainer
    resumed_at = None
    if args.resume:
        checkpoint = args.out / CHECKPOINT
        if not checkpoint.exists():
            raise SystemExit(f"--resume: no checkpoint at {checkpoint} (run once without "
                             f"--resume first).")
        try:
            trainer.load_from_file(checkpoint)
        except CheckpointError as err:
            raise SystemExit(f"--resume: cannot load {checkpoint}: {err} (resume with the "
                             f"--sampler and --buffer-size of the saved run)") from err
        resumed_at = trainer.collected_frames
        trainer.total_frames = resumed_at + args.steps
        print(f"resumed from {checkpoint}: {resumed_at} steps done, buffer holds "
              f"{len(run.replay_buffer)} transitions (write count "
              f"{run.replay_buffer.write_count})", flush=True)
    print(f"DQN on CartPole-v1, {args.sampler} replay, {args.steps} steps, seed {args.seed}",
          flush=True)

    start = time.perf_counter()
    trainer.train()  # evaluates after the last batch, then saves the checkpoint
    wall = time.perf_counter() - start

    history = run.evaluator.history
    final = history[-1][1]
    summary = {
        "sampler": args.sampler,
        "seed": args.seed,
        "steps": trainer.collected_frames,
        "optim_steps": trainer.optim_count,
        "resumed_at": resumed_at,
        "final_eval_return": final,
        "best_eval_return": run.evaluator.best,
        "wall_time_s": round(wall, 1),
        "buffer_len": len(run.replay_buffer),
        "buffer_write_count": run.replay_buffer.write_count,
        "history": history,
        "checkpoint": str(args.out / CHECKPOINT),
    }
    plot(history, resumed_at, args.out / "returns.png",
         f"DQN on CartPole-v1 ({args.sampler} replay, seed {args.seed})")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"done: {trainer.collected_frames} steps, {trainer.optim_count} optimisation steps in "
          f"{wall:.0f} s; final eval return {final:.1f}, best {run.evaluator.best:.1f}", flush=True)
    print(f"wrote {args.out / 'returns.png'}, {args.out / 'summary.json'} and the checkpoint "
          f"{args.out / CHECKPOINT}", flush=True)
    summary["run"] = run
    return summary


if __name__ == "__main__":
    main()
