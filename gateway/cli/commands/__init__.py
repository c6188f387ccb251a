"""One module per `canary` subcommand: `serve`, `candidates`, `report`, `promote`, `rollout`,
`label`, `plan`, `capacity`, `db`, `demo`, `sim`."""
