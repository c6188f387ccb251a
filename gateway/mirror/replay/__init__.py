"""From a queued copy to a stored pair: `ring` (bounded, deduplicated, session-ordered
buffers, pure), `order` (turns that arrive out of order), `lane` (one candidate's workers),
`observe` (metered answers to storage records, pure), `wait` (how long the scorer and the
grader wait for a copy's answer: from when a worker takes it), `tokens` (every arm's answer counted
by one tokenizer before it is stored; `local_tokens`: the model's tokenizer.json), `sinks`
(an in-memory sink for tests and the demo), `validity` (every arm's tool calls judged
against the request's declared tools before it is stored), `splits` (conversations seen
split across replicas)."""
