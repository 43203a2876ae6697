"""The one model lifecycle of ``serve`` and the gateway: log, load, replay, check, swap.

- :mod:`.completion_log`: the gateway's log of finished requests, what the pipeline retrains on;

- :mod:`.sources`: an operator's URI resolved to a version; registry models are loaded in a
  child process (:mod:`.fetch`), so MLflow never enters a serving process;
- :mod:`.recent`: the ring of recent completions a new model learns before it serves;
- :mod:`.renew`: the steps in order (load and health-check off the event loop, replay the ring,
  the completions that came in meanwhile, swap) and the one result, :class:`~.renew.ReloadOutcome`.
"""
