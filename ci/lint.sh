#!/usr/bin/env bash
# The checks that run before the test suite (ci/test.sh), in seconds: ruff's lint and format check on the
# Python (rules in pyproject.toml's [tool.ruff]), TypeScript's strict compiler on the browser runtime and its workers,
# Biome's linter and format check on them and the site's scripts (rules in biome.jsonc; it writes nothing),
# and mypy on the lantern package (ci/mypy.sh; settings in [tool.mypy]). Needs the setup (ci/setup.sh:
# .venv with the test extra, webruntime/node_modules). The same tools run from .pre-commit-config.yaml.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== ruff check"
.venv/bin/ruff check .
echo "== ruff format --check"
.venv/bin/ruff format --check .
echo "== tsc (webruntime, worker)"
(cd webruntime && npm run --silent typecheck)
echo "== biome (webruntime, worker, site)"
(cd webruntime && npm run --silent lint -- --colors=off)
echo "== mypy (the lantern package)"
bash ci/mypy.sh
