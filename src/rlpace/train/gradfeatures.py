"""Per-rollout gradient features from forward/backward hooks, projected without ever forming
a per-rollout gradient (LoGra-style Kronecker sketch) — what `Feedback.grads` carries.

For a linear layer y = W·a applied to the T positions of one row (one rollout), that row's
gradient is G_i = Σ_t b_t a_tᵀ with b_t = ∂L/∂y_t. With fixed seeded Gaussian matrices
P_in (k_i × d_in) and P_out (k_o × d_out), entries N(0, 1/k),

    P_out · G_i · P_inᵀ = Σ_t (P_out b_t)(P_in a_t)ᵀ          (k_o × k_i per row)

so a forward hook stores P_in·a_t (n × T × k_i, not the activations) and one
`torch.autograd.grad` of the loss with respect to the hooked layers' *outputs* gives b_t —
the parameters' gradients are never formed per row (Choe et al. 2024, "What is Your Data
Worth to GPT?", arXiv 2405.13954; the identity is exact, the sketch preserves inner products
in expectation). Because a rollout's loss term is linear in its loss weight, row i's feature
is the projected gradient of rollout i's term, and the rows sum to the batch gradient's.

Parameter subsets (`grad_params`): "lm_head" (the output projection; with tied embeddings
only its output-projection part), "last_block" (every nn.Linear of the last decoder layer),
"all" (every nn.Linear, lm_head included). Bias gradients are left out. The feature
dimension is Σ_layers k_o·k_i ≤ `grad_dim`, with each layer's budget grad_dim // layers
split as k_o = min(isqrt(budget), d_out), k_i = min(budget // k_o, d_in).

Rows must be rollouts. Exact features need every hooked call to see one row per rollout —
except lm_head's call over the shared prompt forward (below). For "last_block" and "all" the
built-in trainer forwards [prompt | completion] per row (`grad_exact=True`), not the
shared-prefix path, whose prompt forward is shared by a group's rollouts and cannot be split
by row. With `shared_prefix=True` (`grad_exact=False`) calls over the shared prompt rows are
skipped: the features cover completion positions only — for lm_head every completion token
but the first (whose logits come from the prompt forward); for inner layers the prompt
positions' share is left out. Cheaper (no extra prompt forwards), not exact.

lm_head over the shared prompt forward, exactly (`first_token`, the trainer's default for
`grad_params="lm_head"`): the prompt forward's head call sees one row per group, and only its
last position feeds the loss — as the logits z of every rollout's first completion token, z
repeated G times (`completion_logprobs(..., first_logits=True)` returns that repeated
tensor, [N, 1, V]). Rollout i's part of that call's gradient is b_i ⊗ h, with h the prompt's
last hidden state (shared, captured by the hook) and b_i = ∂L/∂z_i — the gradient at row i
of the repeated tensor, which the same `torch.autograd.grad` call returns. So every
objective (clipping, token weights, a temperature) is covered, and the rest of row i's
feature comes from the completion forward's head call as usual. Exact (the tests compare it
with single-rollout `backward()` calls). Needs those logits to be the head's output: checked
(`torch.equal` of each group's first row with the call's last position), which fails for
models that scale or soft-cap logits after the head — ValueError. (Earlier versions built
b_i in closed form, (∂L/∂ℓ_i)·(e_{y_i0} − softmax(z/τ))/τ from the first log-prob's
gradient and a log-softmax check: the same numbers, with some 25 more torch calls.)
Inner layers have no such term (their prompt positions reach every completion token
through the repeated KV cache), so "last_block" and "all" keep the per-row forward.
The trainer's forward is packed (`completion_logprobs(..., packed=True)`: one call per group
over [prompt | o_1 | … | o_G]); `FirstToken.prompt_len` then tells `features` where the prompt
ends, and the head's one call is split: the prompt's last position is the first-token term
above, rollout j's completion positions its own rows (the same features, tested).

Example:
    >>> # gf = GradFeatures(model, "lm_head", grad_dim=256, seed=0)
    >>> # with gf.capture():
    >>> #     loss = policy_loss(...).loss           # forward over N rows
    >>> # feats = gf.features(loss, n_rows=N)      # float32[N, gf.dim]; then loss.backward()
"""

from __future__ import annotations

from ..errors import InputError
import contextlib
import math
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from ..types import Feedback

__all__ = ["GradFeatures", "FirstToken", "GRAD_PARAMS", "select_linears", "needs_grad_features",
           "needs_ref_grad", "heldout_reference", "split_with_grads"]

GRAD_PARAMS = ("lm_head", "last_block", "all")


class FirstToken(NamedTuple):
    """What `GradFeatures.features` needs for lm_head's exact first-token term over a shared
    prompt forward (module docstring).

    logits: float[N, 1, V] the first completion token's logits as the loss read them, still
        in the graph: `completion_logprobs(..., first_logits=True)[1]` (rows in groups of
        G = N / prompts, each group's rows the prompt forward's last position).
    prompt_len: with `completion_logprobs(..., packed=True)`, the padded prompt length P: the
        head's one call then runs over [prompt | o_1 | … | o_G] per group, and rollout j's
        completion positions are P + j·T … P + (j + 1)·T − 1 of its group's row; None for the
        two-call path (a prompt call, then one completion row per rollout).
    """
    logits: torch.Tensor
    prompt_len: int | None = None


class _Layer(NamedTuple):
    name: str
    module: nn.Linear
    p_in: torch.Tensor    # [k_i, d_in]
    p_out: torch.Tensor   # [k_o, d_out]


def select_linears(model: nn.Module, grad_params: str) -> list[tuple[str, nn.Linear]]:
    """(name, module) of the nn.Linear layers a `grad_params` subset names, in model order."""
    if grad_params not in GRAD_PARAMS:
        raise InputError(f"grad_params must be one of {', '.join(GRAD_PARAMS)}; got {grad_params!r}.")
    named = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if grad_params == "all":
        out = named
    elif grad_params == "lm_head":
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        out = [(n, m) for n, m in named if m is head]
    else:
        lists = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m)]
        if not lists:
            raise InputError("grad_params='last_block' needs a model with a list of decoder layers "
                             "(an nn.ModuleList); use 'lm_head' or 'all'.")
        name, layers = max(lists, key=lambda x: len(x[1]))
        last = layers[len(layers) - 1]
        out = [(f"{name}.{len(layers) - 1}.{n}", m) for n, m in last.named_modules() if isinstance(m, nn.Linear)]
    if not out:
        raise InputError(f"grad_params={grad_params!r} selects no nn.Linear layer of this model; use 'all'.")
    return out


class GradFeatures:
    """Projected per-row gradients of a loss over a subset of a model's linear layers.

    Args:
        model: the policy (any torch module; Hugging Face causal LMs for "lm_head").
        grad_params: "lm_head" | "last_block" | "all".
        grad_dim: upper bound on the feature dimension d (see the module docstring); ≥ 1.
        seed: seed of the projection matrices, fixed for the run, so features of different
            steps (and the held-out reference) live in one space.

    Attributes:
        dim: the feature dimension d = Σ_layers k_o·k_i.
        layers: the hooked layers with their projections.
    """

    def __init__(self, model: nn.Module, grad_params: str = "lm_head", grad_dim: int = 256, seed: int = 0):
        if isinstance(grad_dim, bool) or not isinstance(grad_dim, int) or grad_dim < 1:
            raise InputError(f"grad_dim must be an int ≥ 1; got {grad_dim!r}.")
        chosen = select_linears(model, grad_params)
        budget = max(1, grad_dim // len(chosen))
        dev = next(model.parameters()).device
        layers = []
        for idx, (name, mod) in enumerate(chosen):
            k_o = max(1, min(math.isqrt(budget), mod.out_features))
            k_i = max(1, min(budget // k_o, mod.in_features))
            gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + idx)
            p_in = torch.randn(k_i, mod.in_features, generator=gen) / math.sqrt(k_i)
            p_out = torch.randn(k_o, mod.out_features, generator=gen) / math.sqrt(k_o)
            layers.append(_Layer(name, mod, p_in.to(dev), p_out.to(dev)))
        self.layers = layers
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        self.head = next((i for i, l in enumerate(layers) if l.module is head), None)   # lm_head's index
        self.dim = sum(l.p_in.shape[0] * l.p_out.shape[0] for l in layers)
        self._calls: list[tuple[int, torch.Tensor, torch.Tensor]] = []   # (layer, P_in·a, y)

    @contextlib.contextmanager
    def capture(self, graph_from_hooks: bool = False):
        """Record P_in·a and the output y of every hooked call made inside the block.

        `graph_from_hooks=True` is for a forward run under `torch.no_grad()` that exists only
        for the features (the TRL adapter's feature pass): each hooked layer switches autograd
        on as it is called, so the graph starts at the first hooked layer — nothing before it
        stores activations (for lm_head: the whole body runs as inference) — and a hooked
        output that needs no grad (a frozen layer, e.g. under LoRA) is made a leaf that does.
        `features` then differentiates the loss to those outputs as usual.
        """
        self._calls = []

        def hook(idx):
            def fn(module, inputs, output):
                a = inputs[0].detach()
                p_in = self.layers[idx].p_in
                if graph_from_hooks and not output.requires_grad:
                    output = output.detach().requires_grad_(True)
                self._calls.append((idx, a.to(p_in.dtype) @ p_in.T, output))
                return output if graph_from_hooks else None
            return fn

        def grad_on(module, inputs):
            torch.set_grad_enabled(True)   # the caller's no_grad block restores its mode on exit

        handles = [l.module.register_forward_hook(hook(i)) for i, l in enumerate(self.layers)]
        if graph_from_hooks:
            handles += [l.module.register_forward_pre_hook(grad_on) for l in self.layers]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    def features(self, loss: torch.Tensor, n_rows: int, shared_prefix: bool = False,
                 first_token: FirstToken | None = None, wrt: tuple = ()):
        """float32[n_rows, dim] projected gradient of each row's part of `loss` (captured).

        Runs `torch.autograd.grad(loss, outputs, retain_graph=True)`: the graph stays for the
        caller's (weighted) backward. ValueError when nothing was captured or a hooked call
        did not see one row per rollout — unless `shared_prefix`, which skips such calls
        (completion positions only; see the module docstring), or the call is lm_head's over
        a shared prompt forward and `first_token` is given: its exact per-row share then
        comes from the gradient at the repeated first-token logits (module docstring).

        With `wrt` (tensors `loss` was built from: the log-probs, a ones tensor of loss
        weights) the same autograd call also returns their gradients, and the result is
        (features, (∂loss/∂t for t in wrt)) — zeros where `loss` does not read t. What lets
        the recipe start its weighted backward at the log-probs (`losses.logp_grad_scale`)
        and read the weighted loss's value off ∂loss/∂weight (the loss is linear in it).
        """
        calls, shared = self._calls, []                    # shared: lm_head calls over shared prompt rows
        if first_token is not None and self.head is not None:
            shared = [c for c in calls if c[0] == self.head and c[1].shape[0] != n_rows]
            calls = [c for c in calls if not (c[0] == self.head and c[1].shape[0] != n_rows)]
        if shared_prefix:
            calls = [c for c in calls if c[1].shape[0] == n_rows]
        packed = bool(shared) and first_token.prompt_len is not None
        if not calls and not packed:
            raise InputError("GradFeatures.features: no hooked call with one row per rollout was captured; "
                             "run the forward inside `with gf.capture():`.")
        for idx, pa, y in calls:
            if pa.shape[0] != n_rows:
                raise InputError(f"GradFeatures: layer {self.layers[idx].name} was called on {pa.shape[0]} "
                                 f"rows, not one per rollout ({n_rows}); forward [prompt | completion] "
                                 f"per row (group_size=1), not the shared-prefix path.")
        if len(shared) > 1:
            raise InputError(f"GradFeatures: lm_head was called {len(shared)} times on the shared prompt rows; "
                             f"features cover one forward (capture each forward separately).")
        head = shared[0] if shared else None             # lm_head's call over the shared prompt rows
        if head is not None:                             # before any work: the logits must be this call's
            _check_first_token(head[1], head[2], first_token.logits, n_rows, first_token.prompt_len)
        outs = ([y for _, _, y in calls] + ([first_token.logits] if head else []) + ([head[2]] if packed else [])
                + list(wrt))
        grads = torch.autograd.grad(loss, outs, retain_graph=True, allow_unused=True)
        # (layer, P_in a_t, b_t = ∂L/∂y_t) of every call; the prompt call's share per rollout is
        # one more position: b_i = ∂L/∂z_i at the repeated first-token logits, a = its group's
        # last prompt position h (module docstring)
        parts = [(idx, pa, b) for (idx, pa, _), b in zip(calls, grads)]
        if head is not None:
            idx, pa, y = head
            g, last = n_rows // pa.shape[0], (first_token.prompt_len or pa.shape[1]) - 1
            parts.append((idx, pa[:, last:last + 1].repeat_interleave(g, dim=0), grads[len(calls)]))
            if first_token.prompt_len is not None:       # packed: the completions' positions, one row each
                b_y = grads[len(calls) + 1]
                if b_y is not None:
                    parts.append((idx, pa[:, last + 1:].reshape(n_rows, -1, pa.shape[-1]),
                                  b_y[:, last + 1:].reshape(n_rows, -1, b_y.shape[-1])))
        # Per layer, the (P_out b_t, P_in a_t) pairs as [n, t, k_o], [n, t, k_i], then one batched product.
        terms: list[list] = [[] for _ in self.layers]
        for idx, pa, b in parts:
            if b is None:
                continue                                               # output unused by the loss
            pb = b.detach().to(pa.dtype) @ self.layers[idx].p_out.T    # [n, (T,) k_o]
            terms[idx].append((pb, pa) if pb.dim() == 3 else (pb[:, None], pa[:, None]))
        self._calls = []
        feats = []
        for l, ts in zip(self.layers, terms):
            k_o, k_i = l.p_out.shape[0], l.p_in.shape[0]
            if not ts:
                feats.append(torch.zeros(n_rows, k_o * k_i, dtype=l.p_in.dtype, device=l.p_in.device))
                continue
            pb = ts[0][0] if len(ts) == 1 else torch.cat([t[0] for t in ts], dim=1)     # [n, T', k_o]
            pa = ts[0][1] if len(ts) == 1 else torch.cat([t[1] for t in ts], dim=1)     # [n, T', k_i]
            feats.append(torch.bmm(pb.transpose(1, 2), pa).reshape(n_rows, k_o * k_i))  # Σ_t (P_out b_t)(P_in a_t)ᵀ
        out = (feats[0] if len(feats) == 1 else torch.cat(feats, dim=1)).float()
        if not wrt:
            return out
        rest = grads[len(outs) - len(wrt):]
        return out, tuple(torch.zeros_like(t) if gt is None else gt.detach() for t, gt in zip(wrt, rest))

    def project(self, weight_grads: list[torch.Tensor]) -> torch.Tensor:
        """float32[dim] the feature of full weight gradients (one per hooked layer, in order):
        concat of P_out·∇W·P_inᵀ. What `features` equals row by row (used by the tests)."""
        return torch.cat([(l.p_out @ g.to(l.p_in.dtype) @ l.p_in.T).reshape(-1)
                          for l, g in zip(self.layers, weight_grads)]).float()


def _check_first_token(pa: torch.Tensor, y: torch.Tensor, z: torch.Tensor, n_rows: int,
                       prompt_len: int | None = None) -> None:
    """ValueError unless z ([n_rows, 1, V], `FirstToken.logits`) is lm_head's call `y` over
    the shared prompt rows (pa.shape[0] of them), last prompt position (the call's last, or
    `prompt_len` − 1 when packed), repeated per group: only
    then is ∂L/∂z_i rollout i's share of that call's output gradient (module docstring)."""
    rows = pa.shape[0]
    if y.dim() != 3 or n_rows % rows or tuple(z.shape[:2]) != (n_rows, 1):
        raise InputError(f"GradFeatures: lm_head was called on {rows} rows, not whole groups of the "
                         f"{n_rows} rollouts' shared prompts (first-token logits {tuple(z.shape)}); forward "
                         f"[prompt | completion] per row.")
    last = (prompt_len or y.shape[1]) - 1
    if not torch.equal(z[::n_rows // rows, 0].detach(), y[:, last].detach().to(z.dtype)):
        raise InputError("GradFeatures: lm_head's output over the prompt is not the first token's logits "
                         "(the model scales or soft-caps logits after the head, or they hold NaN); forward "
                         "[prompt | completion] per row (group_size=1) for exact features, or in the "
                         "trainer set grad_exact=false (approximate).")


# ---- what the built-in recipe calls ----------------------------------------------------------
def needs_grad_features(sched, mode: str) -> bool:
    """Whether the recipe computes features: `mode` "on" / "off", or "auto" = when a policy of
    the Scheduler's method reads them (`DataPolicy.reads` holds "grads": diem, dvc, also inside
    a chain such as "per_advantage>diem")."""
    if mode in ("on", "off"):
        return mode == "on"
    return any("grads" in p.reads for p in sched.method.policies().values())


def needs_ref_grad(sched) -> bool:
    """Whether a policy of the Scheduler's method reads `Feedback.ref_grad` (`DataPolicy.reads`
    holds "ref_grad": diem with importance="reference", dvc's influence value): the built-in
    recipe computes the held-out reference gradient only then (it costs a per-row forward and
    backward of the held-out answers every `grad_ref_every` steps)."""
    return any("ref_grad" in p.reads for p in sched.method.policies().values())


def heldout_reference(model, gf: GradFeatures, rollout, temperature: float = 1.0):
    """float32[d] numpy: the feature of the gradient of a held-out loss — the mean NLL per
    answer token of `rollout` (teacher-forced reference answers, `LossProbe.rollout`), so
    ⟨f_z, ref⟩ > 0 when descending on rollout z's loss also descends the held-out loss."""
    from .rollout import completion_logprobs

    with torch.enable_grad(), gf.capture():
        logp = completion_logprobs(model, rollout, temperature, group_size=1)      # [P, T]
        mask = rollout.completion_mask.to(logp.dtype)
        loss = -(logp * mask).sum() / mask.sum().clamp(min=1)
    feats = gf.features(loss, rollout.completion_ids.shape[0])
    return feats.sum(0).detach().cpu().numpy().astype("float32")


def split_with_grads(fb, rows, trained, cols):
    """[Feedback of the groups `rows` (indices into fb) with the features of rows `cols` of
    `trained` (`trained.grads[cols]`, `trained.ref_grad`), Feedback of fb's other groups
    without] — empty parts left out. How the recipe reports a round's groups once features
    exist: trained groups carry them, dropped ones cannot. `trained` is the training batch's
    Feedback; row `cols[k]` of it is group `rows[k]` of fb (ValueError when the prompt ids or
    the group size disagree).

    fb and `trained` are validated Feedbacks, so the parts, row subsets of their read-only
    arrays, are assembled without validating them again (re-checking the [B, G, d] features
    cost as much as the rest of the split). Fields other than prompt_ids, rewards, advantages,
    step, lengths, grads and ref_grad are left None.

    >>> fb = Feedback([5, 6, 7], [[1, 0], [0, 0], [1, 1]])
    >>> tr = Feedback([7, 5], [[1, 1], [1, 0]], grads=np.arange(8.0).reshape(2, 2, 2))
    >>> parts = split_with_grads(fb, [2, 0], tr, [0, 1])
    >>> [(p.prompt_ids.tolist(), None if p.grads is None else p.grads[:, :, 0].tolist()) for p in parts]
    [([7, 5], [[0.0, 2.0], [4.0, 6.0]]), ([6], None)]
    """
    rows = np.asarray(rows, dtype=np.int64)
    cols = np.asarray(cols, dtype=np.int64)
    others = np.ones(fb.batch_size, dtype=bool)
    others[rows] = False
    rest = np.flatnonzero(others)                          # sorted, as np.setdiff1d (a tenth of its cost)
    if rows.size and (trained.grads is None or rows.shape != cols.shape
                      or not np.array_equal(fb.prompt_ids[rows], trained.prompt_ids[cols])
                      or trained.grads.shape[1] != fb.group_size):
        raise InputError("split_with_grads: rows of the round's Feedback and cols of the trained batch's "
                         "must name the same groups (same prompt ids and group size), and the trained "
                         "batch's Feedback must carry grads.")
    out = []
    if rows.size:
        out.append(_rows(fb, rows, trained.grads[cols], trained.ref_grad))
    if rest.size:
        out.append(_rows(fb, rest))
    return out


def _rows(fb, idx, grads=None, ref_grad=None):
    """Feedback of fb's groups `idx` (+ grads, ref_grad), from already validated arrays: what
    `Feedback(fb.prompt_ids[idx], fb.rewards[idx], ..., grads=grads, ref_grad=ref_grad)` builds,
    without a second validation (`split_with_grads`)."""
    return Feedback._from_validated(
        prompt_ids=fb.prompt_ids[idx], rewards=fb.rewards[idx], step=fb.step,
        advantages=None if fb.advantages is None else fb.advantages[idx],
        lengths=None if fb.lengths is None else fb.lengths[idx], grads=grads, ref_grad=ref_grad)
