"""Paired statistics and the comparison report.

* `rlpace.evaluation` (this module): pure statistics over arrays with an explicit
  `random_state` (`paired_t_interval`, `paired_bootstrap_interval`,
  `probability_of_improvement`, `ratio_to_target`, `spearman_rho`, `kendall_tau`,
  `holm_adjust`, summaries), the records → arrays step (`score_matrix`), `analyze`, and
  the report writers.
* `rlpace.evaluation.plots`: drawing only; each function returns `fig, ax`.

The protocol follows DataFlex-RL (arXiv 2609.06107): matched
seeds, paired 95% CIs against uniform GRPO on the domain-balanced summary, and a check of
the ranking under other summaries.

>>> import numpy as np
>>> from rlpace.evaluation import paired_t_interval
>>> round(paired_t_interval(np.array([0.5, 0.6]), np.array([0.4, 0.4])).estimate, 3)
0.15
"""

from ._analysis import Analysis, Comparison, analyze, default_summaries, efficiency_table, parse_summary
from ._efficiency import (CostRatio, Curve, Efficiency, captured_share, cost_to_reach, curves_from_runs,
                          efficiency_vs_baseline, gain_target, normalized_auc, paired_cost_ratio)
from ._report import ReportFiles, write_report
from ._stats import (Interval, RankingSensitivity, RatioResult, TTest, as_rng, benchmark_means,
                     domain_balanced_weights, holm_adjust, kendall_tau, method_ranks,
                     multiple_comparison_note, paired_bootstrap_interval, paired_differences,
                     paired_t_interval, poi_bootstrap_interval, probability_of_improvement, rankdata,
                     ranking_sensitivity, ratio_to_target, spearman_rho, subset_weights, summarize,
                     summary_weights, t_band)
from ._tables import ScoreMatrix, domain_prob_series, learning_curves, score_matrix, to_target_arrays

__all__ = [
    "Interval", "TTest", "RatioResult", "RankingSensitivity", "as_rng", "benchmark_means",
    "domain_balanced_weights", "subset_weights", "summary_weights", "summarize",
    "paired_differences", "paired_t_interval", "paired_bootstrap_interval",
    "probability_of_improvement", "poi_bootstrap_interval", "ratio_to_target", "rankdata",
    "method_ranks", "spearman_rho", "kendall_tau", "ranking_sensitivity", "holm_adjust",
    "multiple_comparison_note", "t_band",
    "ScoreMatrix", "score_matrix", "learning_curves", "domain_prob_series", "to_target_arrays",
    "Analysis", "Comparison", "analyze", "default_summaries", "parse_summary", "efficiency_table",
    "ReportFiles", "write_report",
    "Curve", "CostRatio", "Efficiency", "gain_target", "cost_to_reach", "normalized_auc",
    "paired_cost_ratio", "efficiency_vs_baseline", "captured_share", "curves_from_runs",
]
