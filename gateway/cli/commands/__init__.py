"""One module per `canary` subcommand: `serve`, `candidates`, `report`, `promote`, `rollout`,
`plan`, `capacity`, `db`, `demo`, `sim`."""
