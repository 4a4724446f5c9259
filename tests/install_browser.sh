#!/usr/bin/env bash
# Install Debian's chromium, in which the report tests render report.html headless
# (tests/browser.py). Idempotent: does nothing when chromium is already there. Needs root.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
  echo "install_browser: chromium present"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# Only refresh the package lists when apt does not know chromium (lists absent or pruned).
if ! apt-cache policy chromium 2>/dev/null | grep -q 'Candidate: [0-9]'; then
  echo "install_browser: apt-get update"
  apt-get update -q
fi
apt-get install -y -q chromium
command -v chromium >/dev/null
echo "install_browser: chromium installed"
