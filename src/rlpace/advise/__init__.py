"""`rlpace advise`: predict what scheduling saves on your setup from a short pilot.

pilot record (`PilotRecorder`) → fitted learner (`fit_learner`) → predictions per policy
(`predict`) → advice (`advise`: a table, one sentence, advice.json, advice.html).
Reuses `rlpace.sim` (the learner and its dynamics), `rlpace.evaluation` (rollouts to 80 % of
uniform's gain, captured share) and the policy registry; it has no policy logic of its own.
See docs/advise.md.
"""

from ._fit import LearnerFit, LearnerParams, draw_params, fit_learner, prompt_difficulties, transfer_matrix
from ._advice import Advice, advise, write_advice
from ._predict import Prediction, PolicyPrediction, default_candidates, predict
from ._record import Pilot, PilotRecorder, load_pilot, pilot_from_run_dir, pilot_from_select, read_pilot

__all__ = ["PilotRecorder", "Pilot", "read_pilot", "pilot_from_select", "pilot_from_run_dir", "load_pilot",
           "LearnerFit", "LearnerParams", "fit_learner", "draw_params", "prompt_difficulties", "transfer_matrix",
           "Prediction", "PolicyPrediction", "predict", "default_candidates", "Advice", "advise", "write_advice"]
