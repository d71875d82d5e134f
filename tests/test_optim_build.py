"""`build_optimizer("adamw")` runs torch's multi-tensor (foreach) AdamW, which torch leaves off
on CPU: the same parameters bit for bit as the per-parameter loop, in fewer kernel calls."""

import torch

from rlpace.optim import build_optimizer


def test_adamw_is_foreach_and_bit_identical_to_the_loop():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    twin = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    twin.load_state_dict(net.state_dict())
    start = net[0].weight.detach().clone()
    fast = build_optimizer("adamw", net, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.01)
    loop = torch.optim.AdamW(twin.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.01, foreach=False)
    assert [g["foreach"] for g in fast.param_groups] == [True]
    g = torch.Generator().manual_seed(1)
    for _ in range(25):
        for p, q in zip(net.parameters(), twin.parameters()):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.clone()
        fast.step()
        loop.step()
    for p, q in zip(net.parameters(), twin.parameters()):
        assert torch.equal(p, q)
    assert (net[0].weight - start).abs().min() > 0          # every weight moved
