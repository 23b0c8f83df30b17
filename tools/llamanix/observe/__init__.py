"""Looking at running hosts: the exporter, one reading of a host's instances, its /metrics targets
and scrapes, live figures, the switches' figures and top's rows."""
