"""The `canary` command: `main` (argument parsing), `commands/` (one module per subcommand),
`client` (the admin API client), `progress` (progress bars), `escape` (terminal-safe text)."""
