"""Deciding what a config runs before it runs: plan and its records, init, pin and build of a
variant, port checks."""
