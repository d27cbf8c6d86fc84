"""The SSA paper's synthetic experiments (section 4): Table 1 / Figure 3 (query selectivity on a graph)
and Table 2 (value selectivity on denoising), built from the project's own attention layer and registry."""
