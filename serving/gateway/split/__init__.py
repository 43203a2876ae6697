"""The gateway split in two (``balanceroute gateway --relay-workers N``): one decider process
(the pool, the policies, the estimators, the completion log, the switchback, rank health) and N
relay worker processes that accept the clients, ask the decider which rank, and move the bytes.
They talk in a few compact events per request (:mod:`.wire`); the decider ages the running
requests from each rank's iteration clock (:mod:`.clock`) instead of from every chunk.
"""
