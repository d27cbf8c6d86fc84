"""Analysis metrics of the attention papers: outliers and W8A8, sinks and gates,
spikiness, operator norms and temperatures, head pruning; ``run_analysis`` runs them all."""

# First: report imports the metric modules in the order their metrics run and print in.
from attnlab.eval.analysis.report import format_summary, run_analysis  # isort: skip
from attnlab.eval.analysis.common import mean_loss, perplexity, windows
from attnlab.eval.analysis.outliers import activation_outliers, kurtosis, w8a8_perplexity
from attnlab.eval.analysis.pruning import plot_pruning, pruning_curves, write_pruning_csv
from attnlab.eval.analysis.selectivity import (
    attention_spikiness,
    qk_operator_norms,
    spikiness,
    temperature_html,
    temperature_png,
    token_temperatures,
)
from attnlab.eval.analysis.sinks import attention_sinks, gate_statistics, sink_epsilon, sink_logits

__all__ = [
    "activation_outliers",
    "attention_sinks",
    "attention_spikiness",
    "format_summary",
    "gate_statistics",
    "kurtosis",
    "mean_loss",
    "perplexity",
    "plot_pruning",
    "pruning_curves",
    "qk_operator_norms",
    "run_analysis",
    "sink_epsilon",
    "sink_logits",
    "spikiness",
    "temperature_html",
    "temperature_png",
    "token_temperatures",
    "w8a8_perplexity",
    "windows",
    "write_pruning_csv",
]
