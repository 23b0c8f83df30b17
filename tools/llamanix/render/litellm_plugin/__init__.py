"""What the gateway's LiteLLM loads (``llamanix_gateway``): a directory of its own, so that
putting it on LiteLLM's ``PYTHONPATH`` adds that one module and nothing of llamanix's own
environment."""
