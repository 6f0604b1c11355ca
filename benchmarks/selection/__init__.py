"""Issue 33's research: selection metrics for choosing a training recipe, measured across 13 recipes on
B1-B4, the demo and a four-mode task (benchmarks/results/selection/)."""
