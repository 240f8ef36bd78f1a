"""From samples to claims: summaries, ratios to the baseline, comparisons."""
