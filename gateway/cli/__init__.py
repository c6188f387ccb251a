"""The `canary` command: `main` (argument parsing), `commands/` (one module per subcommand),
`errors` (the one place an error becomes a message and an exit code), `client` (the admin API
client), `progress` (progress bars), `escape` (terminal-safe text), `plan_view` (what `canary plan`
states and its text)."""
