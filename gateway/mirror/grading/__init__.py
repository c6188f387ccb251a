"""The LLM grader of a model upgrade (docs/grading.md): `request` (which pairs are graded and in
which order, the blind A/B request with its JSON-schema `response_format`, the answer's parse;
pure), `prompt` (what the grader is shown: the conversation with its calls and tool results,
the declared tools, each answer's text and calls; pure) and `lane` (the bounded, capped,
budgeted lane toward the grader endpoint, and its accounting). Not to be confused with
`evaluators.judge`, which decides promote / hold / reject."""
