"""Reinforcement-learning workloads (family ``reinforcement``): a PPO actor-critic.

``ppo_mlp`` is the actor-critic of Proximal Policy Optimization (Schulman et al. 2017) for
environments with a flat observation vector and a discrete action set (CartPole by default): two
separate multilayer perceptrons of ``hidden`` tanh units, one ending in the policy's action
logits and one in the state value. One training step is one minibatch of the PPO loss, the
clipped surrogate plus the value loss minus an entropy bonus (``ppo_loss``). In the short test
the minibatch is synthetic (``make_batch``); the time-to-quality task (domains/reinforcement/task.py)
collects it from real environments. The sample unit is the environment transition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dlscale.workloads.base import Workload, register

if TYPE_CHECKING:
    import torch


def build_actor_critic(obs_size: int, n_actions: int, hidden: int = 64, layers: int = 2) -> "torch.nn.Module":
    """An actor-critic whose ``forward(obs)`` returns ``(logits [B, n_actions], value [B])``.

    Orthogonal initialisation with gain sqrt(2) on hidden layers, 0.01 on the policy head (a
    near-uniform first policy, so early rollouts explore) and 1 on the value head: the
    initialisation PPO's reference implementation uses, which matters for its stability.
    """
    import math

    import torch.nn as nn

    def trunk(out: int, head_gain: float) -> nn.Sequential:
        mods: list[nn.Module] = []
        width = obs_size
        for _ in range(layers):
            mods += [_init(nn.Linear(width, hidden), math.sqrt(2)), nn.Tanh()]
            width = hidden
        return nn.Sequential(*mods, _init(nn.Linear(width, out), head_gain))

    class ActorCritic(nn.Module):
        """Separate policy and value MLPs (sharing no trunk, so the value loss cannot disturb the policy)."""

        def __init__(self) -> None:
            super().__init__()
            self.policy = trunk(n_actions, 0.01)
            self.value = trunk(1, 1.0)

        def forward(self, obs: Any) -> tuple[Any, Any]:
            return self.policy(obs), self.value(obs).squeeze(-1)

    return ActorCritic()


def _init(layer: Any, gain: float) -> Any:
    import torch.nn as nn

    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def ppo_loss(model: Any, obs: Any, actions: Any, old_logp: Any, adv: Any, returns: Any, clip: float = 0.2,
             vf_coef: float = 0.5, ent_coef: float = 0.01) -> Any:
    """PPO's loss of one minibatch: ``-mean(min(r A, clip(r, 1-c, 1+c) A)) + vf_coef * 0.5 * mean((V - R)^2)
    - ent_coef * mean(H(pi))`` with ``r = exp(log pi(a|s) - old log pi(a|s))``.

    Advantages are normalised to zero mean and unit variance within the minibatch (the scale of
    rewards then does not change the policy step). Log-probabilities are computed in float32 so
    that bf16 autocast does not round the ratio.
    """
    import torch

    logits, value = model(obs)
    logp_all = torch.log_softmax(logits.float(), dim=-1)
    logp = logp_all.gather(1, actions.long().unsqueeze(1)).squeeze(1)
    ratio = torch.exp(logp - old_logp)
    a = (adv - adv.mean()) / (adv.std(unbiased=False) + 1e-8) if adv.numel() > 1 else adv
    surrogate = torch.min(ratio * a, torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * a)
    value_loss = 0.5 * (value.float() - returns).pow(2).mean()
    entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
    return -surrogate.mean() + vf_coef * value_loss - ent_coef * entropy


@dataclass(frozen=True)
class PPOActorCritic(Workload):
    """PPO's actor-critic MLP trained on synthetic minibatches (observations, actions, old
    log-probabilities, advantages, returns); ``batch_size`` is the transitions in one minibatch."""

    name: str = "ppo_mlp"
    source: str = "dlscale"
    description: str = "PPO actor-critic: separate 2x64 tanh MLPs for policy logits and value (CartPole sized)"
    family: str = "reinforcement"
    obs_size: int = 4
    n_actions: int = 2
    hidden: int = 64
    layers: int = 2
    default_lr: float = 2.5e-4

    def build(self, cfg: Any = None) -> "torch.nn.Module":
        return self.build_for(self.obs_size, self.n_actions)

    def build_for(self, obs_size: int, n_actions: int) -> "torch.nn.Module":
        """The actor-critic sized to an environment's observation vector and action count."""
        return build_actor_critic(obs_size, n_actions, self.hidden, self.layers)

    def make_batch(self, cfg: Any, device: Any, seed: int = 0) -> tuple[Any, Any]:
        """``(obs, (actions, old_logp, advantages, returns))``: random but well-formed (old
        log-probabilities near the uniform policy's, so the ratio is near 1 as in real PPO)."""
        import math

        import torch

        b = int(cfg.batch_size)
        if str(device) == "meta":
            f = torch.empty(b, device="meta")
            return torch.empty(b, self.obs_size, device="meta"), (
                torch.zeros(b, dtype=torch.long, device="meta"), f, f, f)
        g = torch.Generator().manual_seed(seed)
        obs = torch.randn(b, self.obs_size, generator=g)
        actions = torch.randint(0, self.n_actions, (b,), generator=g)
        old_logp = -math.log(self.n_actions) + 0.1 * torch.randn(b, generator=g)
        adv = torch.randn(b, generator=g)
        returns = 10.0 * torch.rand(b, generator=g)
        return obs.to(device), tuple(t.to(device) for t in (actions, old_logp, adv, returns))

    def forward_loss(self, model: Any, inputs: Any, targets: Any) -> Any:
        actions, old_logp, adv, returns = targets
        return ppo_loss(model, inputs, actions, old_logp, adv, returns)

    def flops(self, cfg: Any) -> dict[str, Any] | None:
        """Closed form per transition: 2 FLOPs per weight of the linear layers forward, 3x that to train."""
        fwd = 2.0 * sum(i * o for i, o in self._linear_shapes())
        return {"forward": fwd, "train": 3.0 * fwd,
                "method": "closed form: 2 x linear-layer weights per transition forward, 3x forward to train"}

    def _linear_shapes(self) -> list[tuple[int, int]]:
        widths = [self.obs_size] + [self.hidden] * self.layers
        hidden = list(zip(widths[:-1], widths[1:]))
        return hidden + [(widths[-1], self.n_actions)] + hidden + [(widths[-1], 1)]

    def smoke_shape(self) -> dict[str, Any]:
        return {"batch_size": 8}

    def default_shape(self) -> str:
        return (f"{self.obs_size} observations, {self.n_actions} actions (CartPole), "
                f"{self.layers}x{self.hidden} tanh actor and critic")


register(PPOActorCritic())
