"""Change what a host runs: plan, config edits, the managers (nixos, systemd, up), generations,
the gate, switch, rollback and pin, and the `up` supervisor."""
