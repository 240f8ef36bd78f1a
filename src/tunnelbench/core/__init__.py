"""The ground floor: the results model (metric specs, samples, series, outcomes) and the metric registry.
Imports nothing of the product."""
