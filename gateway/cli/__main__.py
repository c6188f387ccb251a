"""`python -m gateway.cli`: the `canary` command."""

import sys

from gateway.cli.main import main

sys.exit(main())
