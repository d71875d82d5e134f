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


def test_iso_adamw_runs_the_fused_adamw_kernel_on_frames_and_the_rest():
    """`iso_adamw` asks torch's AdamW for its fused kernel (both groups); one step moves every
    weight and bias, and the spectra stay the base's."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    opt = build_optimizer("iso_adamw", net, lr=1e-2)
    assert [(g["fused"], g["foreach"]) for g in opt.param_groups] == [(True, False), (True, False)]
    s0 = [torch.linalg.svdvals(m.weight.detach().double()) for m in (net[0], net[2])]
    before = [p.detach().clone() for p in net.parameters()]
    net(torch.randn(4, 5)).square().sum().backward()
    opt.step()
    assert all(float((p - b).abs().min()) > 0 for p, b in zip(net.parameters(), before))
    for m, s in zip((net[0], net[2]), s0):
        assert float((torch.linalg.svdvals(m.weight.detach().double()) - s).abs().max() / s[0]) < 2e-6
