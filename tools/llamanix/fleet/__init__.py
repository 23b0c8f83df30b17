"""A fleet: hosts switched in turn from one config, here or over ssh by their own llamanix.

commands (what switch and rollback run), dispatch (each host where it lives), rollout (the
order, batches and stopping rules), remote (the controller's side over ssh), agent (the remote
host's side) and protocol (what the two sides say)."""
