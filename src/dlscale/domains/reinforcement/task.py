"""Reinforcement learning to a mean-return target: PPO on a gymnasium environment (``dlscale tta ppo_mlp``).

``--data`` is a gymnasium environment id (default ``CartPole-v1``) with a discrete action space and
a flat observation vector; nothing is downloaded or made (``dlscale dataset reinforcement`` says so).

One epoch is one PPO iteration. Each rank steps ``NUM_ENVS`` fresh copies of the environment for
``batch_size / NUM_ENVS`` steps each (so ``--batch-size`` is the transitions a rank collects per
epoch), sampling actions from the current policy; advantages are GAE(gamma, lambda) estimates
bootstrapped with the value function. It then makes ``UPDATE_PASSES`` passes over the rollout in
``MINIBATCHES`` shuffled minibatches, each one optimizer step of the PPO loss
(workload.py ``ppo_loss``): ``steps_per_epoch = UPDATE_PASSES x MINIBATCHES`` on every rank.

Resume exactness: every epoch starts fresh environments seeded from the epoch's seed (``ctx.seed``,
distinct per epoch and per rank), so no environment state crosses an epoch boundary and a resumed
run collects exactly what the uninterrupted one would. The consequence: episodes are cut at the
end of every epoch's rollout, and the cut is bootstrapped with the value of the last observation
(as GAE does for any unfinished episode), so the return estimates stay unbiased in expectation.
An episode the environment truncates (CartPole's 500-step time limit) is bootstrapped too: its
last reward gets ``gamma x V(final observation)``, since the state was not terminal.

The metric is the mean undiscounted return of ``EVAL_EPISODES`` episodes played with the greedy
policy (argmax of the logits), their environments seeded ``EVAL_SEED + i`` at every evaluation,
so the curve compares like with like across epochs, seeds and runs. An environment without a time
limit is cut at ``EVAL_MAX_STEPS`` steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from dlscale.errors import UsageError
from dlscale.tta.tasks import EpochContext, Task, TaskData, register

NUM_ENVS = 8  # environments each rank steps side by side in a rollout
MINIBATCHES = 4  # minibatches per pass over the rollout
UPDATE_PASSES = 4  # passes (PPO's "epochs") over each rollout
GAMMA = 0.99
GAE_LAMBDA = 0.95
EVAL_EPISODES = 10
EVAL_SEED = 1_000_000  # evaluation episode i resets with seed EVAL_SEED + i, every evaluation alike
EVAL_MAX_STEPS = 10_000  # an episode of an environment without a time limit is cut here in evaluation
LIST_IDS = "python -c 'import gymnasium; gymnasium.pprint_registry()'"


@dataclass
class RLData(TaskData):
    """The environment id and its sizes (what the actor-critic is built for)."""

    env_id: str = "CartPole-v1"
    obs_size: int = 4
    n_actions: int = 2


@dataclass
class PPOBatch:
    """One minibatch of a rollout; ``collected`` is the environment steps it brings in (its size on
    the first pass over the rollout, 0 on later passes), so an epoch's units are the steps collected."""

    obs: Any
    actions: Any
    old_logp: Any
    advantages: Any
    returns: Any
    collected: int


class RLTask(Task):
    family = "reinforcement"
    metric = "mean_return"
    metric_label = "mean return"
    metric_unit = "return"
    higher_is_better = True
    metric_range = (-math.inf, math.inf)  # the environment's rewards decide (CartPole-v1: 0 to 500)
    library = "gymnasium"
    default_model = "ppo_mlp"
    default_target = 475.0  # gymnasium's CartPole-v1 reward_threshold
    default_data = "CartPole-v1"
    default_optimizer = "adam"
    default_lr = 1e-3
    default_weight_decay = 0.0
    default_batch_size = 1024  # environment steps collected per rank per epoch (NUM_ENVS x 128)
    default_max_epochs = 200
    default_lr_schedule = "constant"
    clip_grad_norm = 0.5
    mlperf_benchmark = "minigo"  # MLPerf's only RL benchmark (retired after v1.0)
    mlperf_ruleset = None  # no installed ruleset checks minigo
    dataset_help = ("reinforcement learning makes its data by acting: --data takes a gymnasium environment id "
                    "(default CartPole-v1), and there is no dataset to make")
    clip = 0.2
    vf_coef = 0.5
    ent_coef = 0.01

    # -- data -------------------------------------------------------------------------------------
    def check_made(self, scale: float) -> None:
        self.make_dataset("", scale=scale)

    def make_dataset(self, root: str, seed: int = 0, scale: float = 1.0) -> dict[str, Any]:
        raise UsageError("reinforcement learning needs no dataset: `dlscale tta ppo_mlp --data ENV_ID` takes a "
                         f"gymnasium environment id (default CartPole-v1; list them with {LIST_IDS})")

    def open(self, data: str, cfg: Any) -> RLData:
        """Check ``data`` names a registered environment with discrete actions and a flat observation."""
        env_id = str(data)
        check_rollout_size(cfg.batch_size)
        obs_size, n_actions = inspect_env(env_id)
        per_epoch = int(cfg.batch_size) * int(getattr(cfg, "world_size", 1))
        return RLData(root=env_id, n_train=per_epoch, n_eval=EVAL_EPISODES,
                      describe=f"gymnasium {env_id}: {obs_size} observations, {n_actions} actions; "
                               f"{per_epoch} env steps per epoch, {EVAL_EPISODES} greedy evaluation episodes",
                      info={"env_id": env_id, "obs_size": obs_size, "n_actions": n_actions,
                            "num_envs_per_rank": NUM_ENVS, "env_steps_per_epoch": per_epoch,
                            "eval_episodes": EVAL_EPISODES, "eval_seed": EVAL_SEED},
                      env_id=env_id, obs_size=obs_size, n_actions=n_actions)

    # -- model and training -----------------------------------------------------------------------
    def build_model(self, cfg: Any, data: TaskData) -> Any:
        from dlscale import workloads

        assert isinstance(data, RLData)
        return workloads.get(cfg.model).build_for(data.obs_size, data.n_actions)

    def steps_per_epoch(self, data: TaskData, cfg: Any) -> int:
        return UPDATE_PASSES * MINIBATCHES

    def batches(self, data: TaskData, model: Any, ctx: EpochContext) -> Iterator[PPOBatch]:
        """Collect this rank's rollout with ``model``, then yield UPDATE_PASSES x MINIBATCHES minibatches."""
        import torch

        assert isinstance(data, RLData)
        with one_thread(ctx.cfg):  # the loop's steps between the yields run on it too
            roll = collect_rollout(model, data.env_id, int(ctx.cfg.batch_size) // NUM_ENVS, ctx.seed, ctx.device)
            n = roll["obs"].shape[0]
            g = torch.Generator().manual_seed(ctx.seed)
            for p in range(UPDATE_PASSES):
                for idx in torch.tensor_split(torch.randperm(n, generator=g), MINIBATCHES):
                    idx = idx.to(ctx.device)
                    yield PPOBatch(roll["obs"][idx], roll["actions"][idx], roll["logp"][idx], roll["adv"][idx],
                                   roll["returns"][idx], collected=len(idx) if p == 0 else 0)

    def loss(self, model: Any, batch: PPOBatch) -> Any:
        from dlscale.domains.reinforcement.workload import ppo_loss

        return ppo_loss(model, batch.obs, batch.actions, batch.old_logp, batch.advantages, batch.returns,
                        self.clip, self.vf_coef, self.ent_coef)

    def units(self, batch: PPOBatch) -> int:
        return batch.collected

    def evaluate_shard(self, model: Any, data: TaskData, ctx: EpochContext) -> list[tuple[int, float]]:
        """(episode, return) of this rank's evaluation episodes (their statistics are taken in ``combine``)."""
        assert isinstance(data, RLData)
        mine = list(ctx.shard(EVAL_EPISODES))
        with one_thread(ctx.cfg):
            returns = greedy_returns(model, data.env_id, [EVAL_SEED + i for i in mine], ctx.device) if mine else []
        return list(zip(mine, returns))

    def combine(self, parts: list[list[tuple[int, float]]], data: TaskData) -> dict[str, float]:
        """Mean, min, max and standard deviation of the returns of all ranks' episodes."""
        import numpy as np

        returns = np.asarray([r for _, r in sorted(x for part in parts for x in part)])
        return {"mean_return": float(returns.mean()), "min_return": float(returns.min()),
                "max_return": float(returns.max()), "std_return": float(returns.std())}

    # -- MLPerf -----------------------------------------------------------------------------------
    def mlperf_hparams(self, cfg: Any, peak_lr: float, data: TaskData, steps_per_epoch: int) -> dict[str, Any]:
        h: dict[str, Any] = {"opt_name": cfg.optimizer, "opt_base_learning_rate": peak_lr,
                             "opt_weight_decay": cfg.weight_decay, "opt_gradient_clip_norm": self.clip_grad_norm}
        if cfg.optimizer in ("adam", "adamw"):
            h.update({"opt_adam_beta_1": self.adam_betas[0], "opt_adam_beta_2": self.adam_betas[1],
                      "opt_adam_epsilon": self.adam_eps})
        return h

    def closed_division_problems(self, cfg: Any, peak_lr: float, data: TaskData,
                                 steps_per_epoch: int) -> list[str]:
        # MiniGo (Go self-play to a 50% win rate against a reference) was retired after MLPerf
        # Training v1.0 and no installed ruleset covers it, so there is no closed division to break.
        return []


def check_rollout_size(batch_size: int) -> None:
    """--batch-size is the rollout a rank collects: NUM_ENVS environments times a whole number of steps."""
    if batch_size % NUM_ENVS or batch_size < NUM_ENVS * MINIBATCHES:
        raise UsageError(f"--batch-size {batch_size}: a PPO rollout is {NUM_ENVS} environments x N steps per rank "
                         f"and splits into {MINIBATCHES} minibatches; use a multiple of {NUM_ENVS} that is at "
                         f"least {NUM_ENVS * MINIBATCHES}")


def inspect_env(env_id: str) -> tuple[int, int]:
    """(observation size, action count) of a registered environment; a UsageError naming what is wrong."""
    import gymnasium as gym

    if env_id not in gym.envs.registry:
        raise UsageError(f"--data {env_id}: not a registered gymnasium environment id; list them with {LIST_IDS}")
    try:
        env = gym.make(env_id)
    except Exception as e:  # a missing optional dependency, a broken entry point
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UsageError(f"--data {env_id}: gymnasium cannot make it: {msg}") from None
    try:
        obs, act = env.observation_space, env.action_space
    finally:
        env.close()
    if not isinstance(act, gym.spaces.Discrete):
        raise UsageError(f"--data {env_id}: its action space {act} is not Discrete; ppo_mlp picks one of n actions")
    if not isinstance(obs, gym.spaces.Box) or len(obs.shape) != 1:
        raise UsageError(f"--data {env_id}: its observation space {obs} is not a flat Box vector; ppo_mlp is an MLP")
    return int(obs.shape[0]), int(act.n)


def collect_rollout(model: Any, env_id: str, n_steps: int, seed: int, device: Any) -> dict[str, Any]:
    """NUM_ENVS fresh environments seeded from ``seed`` stepped ``n_steps`` times with actions sampled
    from ``model``'s policy; flat tensors on ``device``: obs, actions, logp, adv (GAE), returns."""
    import torch

    roll = _rollout(model, env_id, n_steps, seed, device)
    adv = gae(roll["rewards"], roll["values"], roll["dones"], roll["last_value"], GAMMA, GAE_LAMBDA)
    flat = lambda a: torch.from_numpy(a.reshape(n_steps * NUM_ENVS, *a.shape[2:])).to(device)  # noqa: E731
    return {"obs": flat(roll["obs"]), "actions": flat(roll["actions"]), "logp": flat(roll["logp"]),
            "adv": flat(adv), "returns": flat(adv + roll["values"])}


@contextmanager
def one_thread(cfg: Any) -> Iterator[None]:
    """Run torch on one intra-op thread unless --threads says otherwise: acting is a forward pass on
    a handful of observations per environment step and a minibatch is a few hundred rows of a 64-wide
    MLP, where more threads only add synchronisation (on 2 busy cores, 8x slower epochs measured)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(getattr(cfg, "threads", None) or 1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _rollout(model: Any, env_id: str, n_steps: int, seed: int, device: Any) -> dict[str, Any]:
    """The arrays [n_steps, NUM_ENVS, ...] of one rollout, and the value of the last observations."""
    import gymnasium as gym
    import numpy as np
    import torch

    env_seeds = np.random.SeedSequence(seed).generate_state(NUM_ENVS)
    envs = [gym.make(env_id) for _ in range(NUM_ENVS)]
    obs = np.stack([e.reset(seed=int(s))[0] for e, s in zip(envs, env_seeds)]).astype(np.float32)
    g = torch.Generator().manual_seed(seed)
    buf = {k: np.zeros((n_steps, NUM_ENVS), np.float32) for k in ("logp", "values", "rewards", "dones")}
    buf_obs = np.zeros((n_steps, *obs.shape), np.float32)
    buf_act = np.zeros((n_steps, NUM_ENVS), np.int64)
    with torch.no_grad():
        for t in range(n_steps):
            logits, value = model(torch.from_numpy(obs).to(device))
            logp_all = torch.log_softmax(logits.float(), -1).cpu()
            act = torch.multinomial(logp_all.exp(), 1, generator=g).squeeze(1)
            buf_obs[t], buf_act[t] = obs, act.numpy()
            buf["logp"][t] = logp_all.gather(1, act.unsqueeze(1)).squeeze(1).numpy()
            buf["values"][t] = value.float().cpu().numpy()
            obs, cut = _step_all(envs, act.tolist(), buf["rewards"][t], buf["dones"][t])
            if cut:  # time-limit truncations: not terminal, so bootstrap with the final state's value
                idx = [i for i, _ in cut]
                v = model(torch.from_numpy(np.stack([o for _, o in cut])).to(device))[1].float().cpu().numpy()
                buf["rewards"][t, idx] += GAMMA * v
        last_value = model(torch.from_numpy(obs).to(device))[1].float().cpu().numpy()
    for e in envs:
        e.close()
    return {**buf, "obs": buf_obs, "actions": buf_act, "last_value": last_value}


def _step_all(envs: list[Any], actions: list[int], rewards: Any, dones: Any) -> tuple[Any, list[tuple[int, Any]]]:
    """Step every environment, resetting those whose episode ended (they continue their own seeded
    stream); fills ``rewards`` and ``dones`` in place; (next observations, [(i, final obs) of truncations])."""
    import numpy as np

    out, cut = [], []
    for i, (env, a) in enumerate(zip(envs, actions)):
        o, r, terminated, truncated, _ = env.step(a)
        rewards[i] = r
        if terminated or truncated:
            dones[i] = 1.0
            if truncated and not terminated:
                cut.append((i, np.asarray(o, np.float32)))
            o, _ = env.reset()
        out.append(o)
    return np.stack(out).astype(np.float32), cut


def gae(rewards: Any, values: Any, dones: Any, last_value: Any, gamma: float, lam: float) -> Any:
    """Generalised advantage estimates [T, N]: ``A_t = delta_t + gamma lam (1 - d_t) A_{t+1}`` with
    ``delta_t = r_t + gamma (1 - d_t) V_{t+1} - V_t``; ``d_t`` = the episode ended at step t."""
    import numpy as np

    adv = np.zeros_like(rewards)
    running = np.zeros_like(last_value)
    for t in range(rewards.shape[0] - 1, -1, -1):
        next_value = values[t + 1] if t + 1 < rewards.shape[0] else last_value
        live = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_value * live - values[t]
        running = delta + gamma * lam * live * running
        adv[t] = running
    return adv


def greedy_returns(model: Any, env_id: str, seeds: list[int], device: Any) -> list[float]:
    """Undiscounted returns of one episode per seed, all played side by side with argmax actions."""
    import gymnasium as gym
    import numpy as np
    import torch

    envs = [gym.make(env_id) for _ in seeds]
    obs = [e.reset(seed=s)[0] for e, s in zip(envs, seeds)]
    returns, steps = [0.0] * len(seeds), [0] * len(seeds)
    active = list(range(len(seeds)))
    while active:
        x = torch.as_tensor(np.stack([obs[i] for i in active]), dtype=torch.float32, device=device)
        actions = model(x)[0].argmax(-1).tolist()
        still = []
        for i, a in zip(active, actions):
            obs[i], r, terminated, truncated, _ = envs[i].step(a)
            returns[i] += float(r)
            steps[i] += 1
            if not (terminated or truncated or steps[i] >= EVAL_MAX_STEPS):
                still.append(i)
        active = still
    for e in envs:
        e.close()
    return returns


register(RLTask())
