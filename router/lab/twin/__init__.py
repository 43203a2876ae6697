"""The decode group's digital twin: replays of recent traffic that choose how much BR-H trusts its estimator."""
