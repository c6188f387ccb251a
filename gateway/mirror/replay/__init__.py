"""From a queued copy to a stored pair: `ring` (bounded, deduplicated, session-ordered
buffers, pure), `order` (turns that arrive out of order), `lane` (one candidate's workers),
`observe` (metered answers to storage records, pure), `tokens` (every arm's answer counted
by one tokenizer before it is stored), `sinks` (an in-memory sink for tests and
the demo), `splits` (conversations seen split across replicas)."""
