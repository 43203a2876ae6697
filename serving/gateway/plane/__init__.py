"""The gateway's data plane, on ``asyncio.Protocol`` with httptools on both sides: the clients'
requests are parsed by :mod:`.front`, the ranks are reached over kept-alive HTTP/1.1
connections (:mod:`..upstream`), and a request's stream is moved by :mod:`.exchange` from the
rank's socket to the client's as it is read. It calls the decider (:mod:`..decider`) directly
in one process, or through :mod:`.wire`'s proxy from a relay worker process (:mod:`.worker`).
"""
