"""Measuring a running server: prompts, the timed streamed request, bench and its records,
intervals, crossover, workloads, the report and the synthetic sweep."""
