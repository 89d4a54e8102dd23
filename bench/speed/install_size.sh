#!/usr/bin/env bash
# What an install costs: a fresh venv, pip upgraded, then `pip install --no-cache-dir SPEC`; prints the
# seconds, the packages (`pip list`) and the venv's size, with `uptime` before and after (a busy machine
# installs slower). docs/install.md quotes it.
#   bash bench/speed/install_size.sh .          # the default install of this checkout
#   bash bench/speed/install_size.sh '.[all]'   # every surface
set -euo pipefail
SPEC="${1:-.}"
VENV="$(mktemp -d)/venv"
trap 'rm -rf "$(dirname "$VENV")"' EXIT
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
uptime
start=$(date +%s.%N)
"$VENV/bin/pip" install -q --no-cache-dir "$SPEC"
end=$(date +%s.%N)
printf 'install: %s\nseconds: %.0f\npackages: %s\nMB: %s\n' "$SPEC" "$(echo "$end - $start" | bc)" \
    "$("$VENV/bin/pip" list --format=freeze | wc -l)" "$(du -sm "$VENV" | cut -f1)"
uptime
