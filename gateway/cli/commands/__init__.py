"""One module per `canary` subcommand: `serve`, `candidates`, `report`, `promote`, `plan`,
`capacity`, `db`, `demo`, `sim`."""
