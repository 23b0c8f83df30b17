"""What runs on a host: the managers (nixos, systemd, up) and up's supervisor, restarts with drain,
blue-green and warm caches, the gateway's venv and start, what a killed switch left, a host's
generations as listed."""
