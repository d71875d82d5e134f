"""`ChainedOptimizer`: several torch optimizers driven as one (Muon for the matrices beside
AdamW for the rest, as `torch.optim.Muon` accepts 2-D parameters only).

One `param_groups` list (the sub-optimizers' own group dicts, so a learning-rate schedule
that writes `group["lr"]` reaches them), one `step`, and one `state_dict` in torch's
standard layout (`{"state": {index: ...}, "param_groups": [...]}`, indices numbered over
the chained groups in order), so any checkpoint code written for a plain optimizer saves
and restores it unchanged.
"""

from __future__ import annotations

from ..errors import InputError
import torch

__all__ = ["ChainedOptimizer", "evaluate_closure"]


def evaluate_closure(closure):
    """The loss of torch's optional `step(closure)` argument, recomputed with gradients on
    (an optimizer's `step` runs under `no_grad`); None without a closure."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class ChainedOptimizer(torch.optim.Optimizer):
    """Drive `optimizers` (a non-empty list of `torch.optim.Optimizer` over disjoint
    parameters) as one optimizer.

    >>> import torch
    >>> w, b = torch.nn.Parameter(torch.ones(3, 2)), torch.nn.Parameter(torch.zeros(3))
    >>> opt = ChainedOptimizer([torch.optim.Muon([w], lr=0.1), torch.optim.AdamW([b], lr=0.1)])
    >>> [len(g["params"]) for g in opt.param_groups]
    [1, 1]
    """

    def __init__(self, optimizers):
        optimizers = list(optimizers)
        if not optimizers or not all(isinstance(o, torch.optim.Optimizer) for o in optimizers):
            raise InputError("optimizers must be a non-empty list of torch.optim.Optimizer instances.")
        self.optimizers = optimizers
        groups = [g for o in optimizers for g in o.param_groups]
        super().__init__(groups, {})
        # add_param_group keeps the very dicts: lr written here reaches the sub-optimizers.
        assert all(a is b for a, b in zip(self.param_groups, groups))

    @torch.no_grad()
    def step(self, closure=None):
        loss = evaluate_closure(closure)
        for o in self.optimizers:
            o.step()
        return loss

    def zero_grad(self, set_to_none: bool = True):
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        state, groups, offset = {}, [], 0
        for o in self.optimizers:
            sd = o.state_dict()
            n = sum(len(g["params"]) for g in sd["param_groups"])
            state.update({int(k) + offset: v for k, v in sd["state"].items()})
            groups += [{**g, "params": [int(i) + offset for i in g["params"]]} for g in sd["param_groups"]]
            offset += n
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        groups = state_dict["param_groups"]
        sizes = [len(g["params"]) for g in self.param_groups]
        if [len(g.get("params", ())) for g in groups] != sizes:
            raise InputError(f"optimizer state has parameter groups of sizes "
                             f"{[len(g.get('params', ())) for g in groups]}, this optimizer {sizes}; it was "
                             f"saved for another model or optimizer.")
        parts, gi, offset = [], 0, 0
        for o in self.optimizers:
            k = len(o.param_groups)
            mine = groups[gi:gi + k]
            n = sum(len(g["params"]) for g in mine)
            st = {int(i) - offset: v for i, v in state_dict["state"].items() if offset <= int(i) < offset + n}
            parts.append({"state": st, "param_groups": [{**g, "params": [int(i) - offset for i in g["params"]]}
                                                        for g in mine]})
            gi, offset = gi + k, offset + n
        for o, sd in zip(self.optimizers, parts):
            o.load_state_dict(sd)
        # Optimizer.load_state_dict replaces the sub-optimizers' group dicts: share them again.
        self.param_groups[:] = [g for o in self.optimizers for g in o.param_groups]
