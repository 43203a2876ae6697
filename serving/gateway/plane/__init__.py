"""The relay worker's data plane on ``asyncio.Protocol`` with httptools on both sides (the
default of ``balanceroute gateway --relay-workers N``): the client's requests are parsed by
:mod:`.front`, the ranks are reached over kept-alive HTTP/1.1 connections (:mod:`.upstream`),
and a request's stream is moved by :mod:`.exchange` from the rank's socket to the client's as it
is read, with a byte search for the few events that matter. Its life is reported to the split
gateway's decider over the same event line as the aiohttp worker's (:mod:`..split.wire`).
"""
