"""rlpace inside Trinity-RFT (0.6): a task selector driven by a `Scheduler`.

Trinity's explorer reads each batch of tasks through a `TasksetScheduler`, which asks the
taskset's selector (`data_selector.selector_type`, a registry name or a dotted class path)
for `get_indices(batch_size)` and, once the batch's experiences went through the
experience pipeline, hands it the pipeline's `selector_metric` as `feedback(indices,
values)`. Its checkpoint is the explorer's `<name>_meta.json`, which holds every selector's
`state_dict()`. Two pieces plug into these seams (config lines: docs/engines.md):

* `RlpaceSelector` (`selector_type: rlpace.adapters.trinity.RlpaceSelector`): proposals
  are `Scheduler.propose`; the Scheduler state rides in the explorer checkpoint.
* `RlpaceGroupFeedback` (experience pipeline operator, listed first): Trinity's own
  `pass_rate_calculator` sends one mean per task; this one sends every rollout's reward, so
  the Scheduler sees the whole group as it does in verl and TRL.

Only the prompt places run here: the selector lives in the explorer, the experience
pipeline elsewhere, so admission, loss weights and supervision transforms are refused
(Trinity's own operators, e.g. `dapo_dynamic_sampling`, filter groups there).

Resume: Trinity's fully_async sync style writes the explorer checkpoint while batches are in
flight and never generates them again on resume; the selector keeps the rows of the batches
whose feedback has not arrived in its state and refuses to resume from a checkpoint that holds
any (the other sync styles collect every batch before they write one). Trinity 0.6 hands a
selector no sync style, so this is the first point where the mode shows.
"""

from __future__ import annotations

import base64
import io
from collections import Counter, defaultdict

import numpy as np

from ..errors import InputError
from ..policies import active_supervision_places, is_neutral
from ..scheduler import Scheduler
from ..types import Pool
from ._convert import Rows, feedbacks_from_rows

try:
    import trinity
    from trinity.buffer.operators.experience_operator import ExperienceOperator
    from trinity.buffer.selector.selector import BaseSelector
    from trinity.common.constants import SELECTOR_METRIC
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("rlpace.adapters.trinity needs Trinity-RFT: pip install 'trinity-rft==0.6.*'") from e

__all__ = ["RlpaceSelector", "RlpaceGroupFeedback", "SUPPORTED", "check_trinity_version"]

SUPPORTED = ("0.6", "0.7")       # [lowest, highest) Trinity-RFT release checked against
_STATE = "rlpace_npz"            # key of the base64 npz Scheduler state inside the selector state
_IN_FLIGHT = "rlpace_in_flight"  # rows of the batches proposed whose feedback has not arrived
_KWARGS = {"policy", "policy_kwargs", "domain_key", "success_threshold"}
_OPTIONAL_COLUMNS = ("cluster_id", "rank_in_cluster", "difficulty")


def check_trinity_version() -> None:
    """InputError unless the installed Trinity-RFT is a release in `SUPPORTED` (a
    pre-release is refused: its selector and checkpoint code may already differ)."""
    from packaging.version import Version
    v, (lo, hi) = Version(trinity.__version__), SUPPORTED
    if v.is_prerelease or v.is_devrelease or not Version(lo) <= v < Version(hi):
        raise InputError(f"rlpace's Trinity-RFT selector supports releases >={lo},<{hi}; trinity-rft {v} "
                         f"is installed. Install trinity-rft=={lo}.*.")


def _pool(dataset, name: str, domain_key: str | None) -> Pool:
    """Pool positions = dataset rows (Trinity's selector indices and `task.index["index"]`)."""
    cols = [c for c in _OPTIONAL_COLUMNS if c in dataset.column_names]
    if domain_key is not None and domain_key not in dataset.column_names:
        raise InputError(f"data_selector.kwargs.domain_key={domain_key!r} is not a column of taskset {name!r} "
                         f"(columns: {sorted(dataset.column_names)}); name a column or drop the key for one domain.")
    records = dataset.select_columns(cols + ([domain_key] if domain_key else [])).to_list()
    if domain_key is None:
        domain_key = "_taskset"
        for r in records:
            r[domain_key] = name
    return Pool.from_records(records, domain_key=domain_key, id_key=None)


def _refuse_trainer_places(sched: Scheduler) -> None:
    """InputError for a method that needs more than group rewards before the next proposal:
    the selector only chooses tasks (Trinity's repeat_times fixes the group size, and the
    experience pipeline, not the selector, holds the experiences)."""
    m = sched.method
    places = [p for p in ("admission", "reweighting", "allocation")
              if getattr(m, p, None) is not None and not is_neutral(getattr(m, p))]
    places += sorted(active_supervision_places(m))
    policies = m.policies().values()
    reads = sorted(set().union(*(p.reads for p in policies)))
    losses = [p.name for p in policies if p.update_losses is not None]
    why = ([f"a policy at {', '.join(places)}"] if places else []) + \
          ([f"trainer signals {reads}"] if reads else []) + ([f"per-token losses ({', '.join(losses)})"] if losses else [])
    if why:
        raise InputError(f"method {sched.name!r} needs {' and '.join(why)}, which the Trinity-RFT selector cannot "
                         f"provide (it chooses tasks from group rewards; Trinity's experience pipeline filters "
                         f"experiences): choose a method with mixture and selection places only (dump, mopps, "
                         f"greso, recommended, ...), or use rlpace's verl or TRL adapter.")


class RlpaceSelector(BaseSelector):
    """Trinity task selector whose batches come from `Scheduler.propose`.

    Config (`buffer.explorer_input.tasksets[i].data_selector`): `selector_type:
    rlpace.adapters.trinity.RlpaceSelector`, `seed` (the Scheduler's), and `kwargs`:
    `policy` (an rlpace method name, e.g. `dump`, `mopps`, `greso`), `policy_kwargs`,
    `domain_key` (a dataset column; without it the taskset is one domain) and
    `success_threshold` (default 0.5). Feedback needs `RlpaceGroupFeedback` as the first
    experience-pipeline operator.
    """

    def __init__(self, data_source, config):
        check_trinity_version()
        super().__init__(data_source, config)
        kw = dict(config.kwargs or {})
        unknown = sorted(set(kw) - _KWARGS)
        if unknown:
            raise InputError(f"unknown data_selector.kwargs {unknown}; valid: {sorted(_KWARGS)}.")
        pool = _pool(data_source.dataset, data_source.name, kw.get("domain_key"))
        self.scheduler = Scheduler(pool, kw.get("policy", "uniform"), seed=int(config.seed),
                                   success_threshold=kw.get("success_threshold", 0.5),
                                   **dict(kw.get("policy_kwargs") or {}))
        _refuse_trainer_places(self.scheduler)
        self._in_flight: list[list[int]] = []        # proposals without feedback yet, oldest first

    def get_indices(self, batch_size: int, return_extra_info: bool = False):
        ids = self.scheduler.propose(int(batch_size)).tolist()
        self._in_flight.append(ids)
        return (ids, {}) if return_extra_info else ids

    def _close(self, indices) -> None:
        """Forget the proposal `indices` came from and every older one: Trinity finishes batches
        in the order it read them (each sync style's `_finish_steps`, fully_async's drain of the
        oldest), and a batch whose tasks all failed sends no feedback at all."""
        want = Counter(int(i) for i in indices)
        for j, ids in enumerate(self._in_flight):
            if not want - Counter(ids):
                del self._in_flight[:j + 1]
                return

    def feedback(self, indices, values) -> None:
        """One batch's groups: `indices[b]` the task's row, `values[b]` its rollouts' rewards
        (from `RlpaceGroupFeedback`). Groups of unequal size become one Feedback per size."""
        if len(indices) != len(values):
            raise InputError(f"selector feedback has {len(indices)} indices but {len(values)} values.")
        if any(np.ndim(v) != 1 for v in values):
            raise InputError("the Trinity-RFT selector got one value per task (pass_rate_calculator's mean), "
                             "not each rollout's reward: list rlpace.adapters.trinity.RlpaceGroupFeedback as "
                             "the first data_processor.experience_pipeline.operators entry, and remove "
                             "pass_rate_calculator.")
        sizes = [len(v) for v in values]
        rows = Rows(group_keys=np.repeat(np.arange(len(values)), sizes).astype(object),
                    prompt_ids=np.repeat(np.asarray(indices, np.int64), sizes),
                    rewards=np.concatenate([np.asarray(v, np.float64) for v in values]) if values else
                    np.zeros(0))
        step = int(self.scheduler.counters.observations)
        for fb, _ in feedbacks_from_rows(self.scheduler.pool, rows, step=step):
            self.scheduler.observe(fb)
        self._close(indices)

    def state_dict(self) -> dict:
        """JSON-safe (Trinity writes it into `<explorer>_meta.json`): the Scheduler's state as a
        base64 npz, exact to the bit, and the rows of the batches still in flight (proposed, no
        feedback yet: only Trinity's fully_async sync style writes its checkpoint then)."""
        buf = io.BytesIO()
        np.savez(buf, **self.scheduler.state_dict())
        return {_STATE: base64.b64encode(buf.getvalue()).decode("ascii"),
                _IN_FLIGHT: [list(b) for b in self._in_flight]}

    def load_state_dict(self, state_dict) -> None:
        # A fresh run: TasksetScheduler hands every selector {"current_index": 0}.
        if _STATE not in state_dict:
            if dict(state_dict) in ({}, {"current_index": 0}):
                return
            raise InputError(f"the explorer checkpoint holds another selector's state ({sorted(state_dict)}), not "
                             f"rlpace's: resume with the selector it was written by, or start a new checkpoint dir.")
        lost = state_dict.get(_IN_FLIGHT) or []
        if lost:
            raise InputError(
                f"the explorer checkpoint was written while {len(lost)} batch(es) rlpace proposed "
                f"({sum(map(len, lost))} tasks) were still being generated: Trinity's fully_async sync style "
                f"writes it at each weight sync without waiting for them, and a resumed explorer does not "
                f"generate them again, so their rewards would never reach the Scheduler and the resumed run "
                f"would not continue the one it resumes. rlpace resumes only from checkpoints written with "
                f"every batch collected, as the fixed, explorer_driven and trainer_driven sync styles write "
                f"them: use one of those to resume, or start a new checkpoint_job_dir.")
        with np.load(io.BytesIO(base64.b64decode(state_dict[_STATE])), allow_pickle=False) as z:
            self.scheduler.load_state_dict({k: z[k] for k in z.files})


class RlpaceGroupFeedback(ExperienceOperator):
    """Experience-pipeline operator (`name: rlpace.adapters.trinity.RlpaceGroupFeedback`):
    passes the experiences through unchanged and reports, per taskset, each task's row and
    its rollouts' rewards as `selector_metric`. A task is `(eid.batch, eid.task)`; a rollout
    is an `eid.run`, whose reward is that of its last step (multi-turn workflows); rollouts
    without a reward are left out. List it first, so that no filter drops groups before it.
    """

    def __init__(self, **kwargs):
        if kwargs:
            raise InputError(f"RlpaceGroupFeedback takes no args; got {sorted(kwargs)}.")

    def process(self, exps):
        runs: dict = defaultdict(dict)           # (taskset, batch, task) -> run -> (step, reward)
        rows: dict = {}
        for e in exps:
            where = (e.info or {}).get("task_index") or {}
            if "taskset_id" not in where or "index" not in where or e.reward is None:
                continue
            key = (where["taskset_id"], str(e.eid.batch), str(e.eid.task))
            rows[key] = int(where["index"])
            best = runs[key].get(e.eid.run)
            if best is None or e.eid.step >= best[0]:
                runs[key][e.eid.run] = (e.eid.step, float(e.reward))
        metric: dict = {}
        for key, by_run in runs.items():
            out = metric.setdefault(key[0], {"indices": [], "values": []})
            out["indices"].append(rows[key])
            out["values"].append([by_run[r][1] for r in sorted(by_run)])
        return exps, {SELECTOR_METRIC: metric}
