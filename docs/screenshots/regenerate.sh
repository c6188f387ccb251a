#!/usr/bin/env bash
# Regenerate the admin page's screenshots (docs/screenshots/*.png): the browser tests write them
# while they drive the page (tests/browser/test_admin_ui.py, test_rollout_panel.py). Needs /usr/bin/chromium
# (apt-get install -y chromium) and the dev extra (Playwright); takes about two minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
CANARY_REQUIRE_BROWSER=1 CANARY_SCREENSHOTS="$PWD/docs/screenshots" \
  "${PYTHON:-python}" -m pytest -q -p no:cacheprovider tests/browser "$@"
ls -l docs/screenshots/*.png
