"""One host's switch as a transaction: the request read and locked, the gate and where it reaches an
instance, the switch, rollback and tidy, and their records."""
