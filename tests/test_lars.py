"""LARS steps against hand-computed updates."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dlscale.tta.lars import make_lars  # noqa: E402


def test_lars_step_by_hand():
    w = torch.nn.Parameter(torch.tensor([[3.0, 4.0]]))  # |w| = 5
    b = torch.nn.Parameter(torch.tensor([1.0]))  # one-dimensional: plain momentum SGD, no decay
    opt = make_lars([w, b], lr=1.0, momentum=0.9, weight_decay=0.01, eta=0.001)
    w.grad = torch.tensor([[0.6, 0.8]])  # |g| = 1
    b.grad = torch.tensor([0.5])
    opt.step()
    trust = 0.001 * 5 / (1 + 0.01 * 5)  # eta |w| / (|g| + wd |w|)
    v1 = trust * torch.tensor([[0.63, 0.84]])  # lr * trust * (g + wd w)
    assert w.detach() == pytest.approx(torch.tensor([[3.0, 4.0]]) - v1)
    assert b.detach() == pytest.approx(torch.tensor([0.5]))
    # second step: momentum carries v1; new trust from the updated weights
    w_now = w.detach().clone()
    w.grad = torch.tensor([[0.6, 0.8]])
    b.grad = torch.tensor([0.5])
    opt.step()
    trust2 = 0.001 * w_now.norm() / (1 + 0.01 * w_now.norm())
    v2 = 0.9 * v1 + trust2 * (torch.tensor([[0.6, 0.8]]) + 0.01 * w_now)
    assert w.detach() == pytest.approx(w_now - v2)
    assert b.detach() == pytest.approx(torch.tensor([0.5 - (0.9 * 0.5 + 0.5)]))


def test_lars_zero_weights_fall_back_to_trust_one():
    w = torch.nn.Parameter(torch.zeros(2, 2))
    opt = make_lars([w], lr=0.1, momentum=0.0, weight_decay=0.0)
    w.grad = torch.ones(2, 2)
    opt.step()
    assert w.detach() == pytest.approx(torch.full((2, 2), -0.1))


def test_lars_rejects_bad_values():
    with pytest.raises(ValueError):
        make_lars([torch.nn.Parameter(torch.ones(2, 2))], lr=0.0)
