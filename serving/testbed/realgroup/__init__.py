"""A real lockstep vLLM group: its step logs, the A/B through the gateway, the fitted cost."""
