"""Teacher-forced scoring of production's answer: `forced` (the scoring requests and what
their answers say, pure) and `jobs` (the scoring copies the mirror process runs)."""
