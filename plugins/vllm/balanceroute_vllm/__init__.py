"""BalanceRoute's vLLM plugin: CPU collectives for MoE data parallelism, and step telemetry.

Installed into a vLLM environment (``pip install plugins/vllm``), it is loaded by vLLM in every
process through the ``vllm.general_plugins`` entry point; no vLLM file is edited.

- On the CPU platform it gives the communicator the variable-size all-gather and reduce-scatter
  that a MoE layer needs with ``--data-parallel-size`` > 1 (``collectives``). Elsewhere (GPUs) it
  leaves communication alone.
- With ``BALANCEROUTE_STEP_LOG=DIR`` it writes every engine core's forward passes, real and
  dummy, to CSV files in DIR (``steps``).
"""

from __future__ import annotations

import logging

log = logging.getLogger("balanceroute_vllm")


def register() -> None:
    """vLLM's general-plugin hook: safe to call more than once in a process."""
    from vllm.platforms import current_platform

    from balanceroute_vllm import collectives, steps

    if current_platform.is_cpu() and collectives.install():
        log.info("balanceroute_vllm: CPU all_gatherv and reduce_scatterv installed (gloo)")
    if steps.install():
        log.info("balanceroute_vllm: step telemetry installed (%s)", steps.ENV)
