"""Routing policies: one interface (``route(state)``), the baselines, BR-0/BR-H and the exact optimum."""
