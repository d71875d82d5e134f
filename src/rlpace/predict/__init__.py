"""An online, staged pass-rate predictor over prompt features (numpy).

P(success | prompt) is modelled by logistic regression on the pool's static annotations:
the prompt's features (`Pool.features`, e.g. the embeddings `rlpace prepare` saves,
standardised over the pool), a one-hot of its domain and, when the pool has clusters other
than its domains, of its cluster. It can score prompts that were never rolled out — the
blind spot of per-prompt statistics when each prompt is seen once or twice in a run.

Used by `criticality_is` (docs/methods/criticality_is.md) and as MoPPS's prior for unseen
prompts (docs/methods/mopps.md). Its state is a NamedTuple of arrays held inside the
policy's state, so `Scheduler.state_dict()` resumes it exactly.

>>> import numpy as np
>>> from rlpace import Pool
>>> from rlpace.predict import predictor
>>> pool = Pool(["a", "b"])
>>> pr = predictor(lr=0.4, stage_steps=100)
>>> st = pr.init(pool)
>>> st = pr.update(st, pool, np.array([0]), np.array([3.0]), np.array([4.0]), np.array([1.0]))
>>> st.theta.round(3).tolist()        # θ = 0.4 · (3 − 4·0.5)/4 · x, x = [1, 1, 0]
[0.1, 0.1, 0.0]
"""

from ._logistic import Predictor, PredictorState, design, predictor

__all__ = ["Predictor", "PredictorState", "predictor", "design"]
