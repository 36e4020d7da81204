#!/usr/bin/env bash
# The main job on its embedded default: install dependencies, build, and run the
# capacity planner on the published DeepSeek V4.1 Flash config.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh >/dev/null
exec build/bin/kvplan --config configs/deepseek-v4.1-flash.config.json "$@"
