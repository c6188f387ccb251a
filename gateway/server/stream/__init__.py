"""How a streamed answer travels back to the client, past the first chunk.

`watch` (the meter's pre-filter for SSE answers nobody stores: only the first token and the
events that can end the stream are parsed) and `relay` (each upstream read metered and written
to the client from the upstream connection's read callback, the task taking over while the
client is not keeping up). The proxy (`server/proxy.py`) uses both.
"""
