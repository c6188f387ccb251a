"""The gateway's configuration: `sections` (the declaration, one Struct per section), `names`
(the flat keys of before the sections and every CANARY_ variable), `load` (reading files,
environment variables and flags, validated once), `tokenizer` (a local tokenizer's file)
and `reference` (every setting as the docs list it). Config sits below the planes and imports
none of them."""
