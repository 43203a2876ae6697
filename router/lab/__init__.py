"""The simulation and experiment lab: the decode-tier simulator, prefill, replays, the A/B harness and its report."""
