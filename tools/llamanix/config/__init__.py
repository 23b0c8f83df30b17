"""The config: its model and parser, which host a command means, an instance's exact argv, and what
another build or pin would change (drift, probe_diff). Pure."""
