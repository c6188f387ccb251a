"""From a queued copy to a stored pair: `ring` (bounded, deduplicated, session-ordered
buffers, pure), `order` (turns that arrive out of order), `lane` (one candidate's workers),
`observe` (metered answers to storage records, pure), `sinks` (an in-memory sink for tests and
the demo), `splits` (conversations seen split across replicas)."""
