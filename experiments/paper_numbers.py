"""The SSA paper's (Zhang et al. 2024) synthetic results, as printed, for the side-by-side tables."""

# Table 1 / Figure 3 (section 4.1). The losses are the Figure 3 caption's "cross-entropy loss"; the temperature
# row is keyed by the paper's "# of neighbors (including itself)" = number of possible next tokens.
TABLE1 = {
    "cross_entropy": {"vanilla": 0.0126, "ssa": 0.009},
    "err_map": {"vanilla": 0.543, "ssa": 0.358},
    "temperature": {1: 0.002, 2: 0.019, 3: 0.152, 4: 0.751},
}

# Table 2 (section 4.2): normalised MSE risk E ||y - y_hat / ||y_hat|| ||^2; L and sigma are not given.
TABLE2 = {"vanilla": 1.390, "value_selective": 0.071, "naive_average": 2.058, "bayes_optimal": 0.003}
