"""Experiment grids and run records.

A `Grid` (policy configurations × matched seeds × suites, under one budget) expands into
`RunSpec`s; `run_grid` runs them on the simulator or the built-in trainer in worker
processes, resumably, and writes one *run record* per run. Records are JSON Lines in a
documented schema (`rlpace.experiments._records`, docs/run-records.md) that the verl and
TRL adapters write too, so `rlpace report` analyses any of them.

>>> from rlpace.experiments import Grid
>>> len(Grid.from_dict({"suite": "sim:ladder", "seeds": 3, "policies": ["uniform", "dump"]}).runs())
6
"""

from ._backends import run_embedded, run_sim, run_spec, sim_result_to_record
from ._grid import Grid, PolicyConfig, RunSpec, load_grid, suite_backend
from ._matrix import DATAFLEX_SLOTS, default_policies
from ._records import (REQUIRED_FIELDS, SCHEMA_VERSION, RecordError, append_record, minimal_record,
                       provenance, read_records, record_from_step_log, records_from_trainer_jsonl,
                       validate_record, write_record)
from ._report import report_from_dir
from ._runner import GridResult, default_workers, record_path, run_grid

__all__ = [
    "Grid", "PolicyConfig", "RunSpec", "load_grid", "suite_backend",
    "run_grid", "GridResult", "default_workers", "record_path",
    "run_spec", "run_sim", "run_embedded", "sim_result_to_record",
    "SCHEMA_VERSION", "REQUIRED_FIELDS", "RecordError", "validate_record", "write_record",
    "append_record", "read_records", "provenance", "minimal_record", "record_from_step_log",
    "records_from_trainer_jsonl",
    "DATAFLEX_SLOTS", "default_policies", "report_from_dir",
]
