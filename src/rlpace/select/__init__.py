"""Budgeted offline data selection: generate → score → route, with a replayable manifest.

DE-Venus's active data selection (arXiv 2609.03324; docs/select.md) over a verl-schema
dataset, in pieces that also work alone:

    groups = read_rollouts("rollouts.jsonl", ids)          # or generate_rollouts(table, model)
    ev = score_groups(groups, ground_truths, abilities)    # pass rate, consistency, token stats
    u = uncertainty_of(ev, "answer_entropy")
    routes, why = route_labeled(ev.pass_rate, u, labeled, band=(0.1, 0.9), budget=1000)
    # without labels: select_probes → calibrate_thresholds → route_unlabeled

and all of it as `select(data, out, ...)` (CLI: `rlpace select DATA --out OUT`), replayed by
`replay(manifest, data, out)` (CLI: `rlpace select --replay MANIFEST --data DATA --out OUT`).
torch and transformers are imported only when a model generates.
"""

from ._generate import generate_rollouts, read_rollouts, response_mask, token_stats
from ._manifest import build_outputs, file_sha256, read_manifest
from ._route import ROUTES, calibrate_thresholds, route_labeled, route_unlabeled, select_probes
from ._score import (UNCERTAINTY, Evidence, answer_consistency, extract_answer, score_groups,
                     uncertainty_of)
from ._select import SelectResult, labeled_rows, replay, select

__all__ = [
    "select", "replay", "SelectResult", "labeled_rows",
    "read_rollouts", "generate_rollouts", "token_stats", "response_mask",
    "Evidence", "score_groups", "extract_answer", "answer_consistency", "uncertainty_of", "UNCERTAINTY",
    "ROUTES", "route_labeled", "route_unlabeled", "select_probes", "calibrate_thresholds",
    "build_outputs", "read_manifest", "file_sha256",
]
