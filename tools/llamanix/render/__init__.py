"""Render a host: systemd units, argv files and the manifest, from a checked config."""
