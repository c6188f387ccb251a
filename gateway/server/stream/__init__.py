"""How a streamed answer travels back to the client, past the first chunk.

`watch` (the meter's pre-filter for SSE answers nobody stores: only the first token and the
events that can end the stream are parsed) and `relay` (each upstream read metered and written
to the client from the upstream connection's read callback, the task taking over while the
client is not keeping up). The proxy (`server/proxy.py`) uses both. `responses`: the Responses
API's stream events and shapes, as the meter (`server/meter.py`) and the watch read them; `chat`:
chat and text completions' chunks and answers, as the meter reads them; `gaps`: the meter's clock
of token events (the inter-event gaps). Those three are leaves the meter may import: no aiohttp,
no asyncio.
"""
