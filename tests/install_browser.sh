#!/usr/bin/env bash
# Installs Debian's chromium for tests/test_pages_in_browser.py, where apt is
# available and we are root (or have passwordless sudo). Elsewhere it says
# so and leaves the browser tests to skip with that reason; it never fails
# the test command.
set -u
for name in chromium chromium-browser google-chrome; do
  if command -v "${name}" >/dev/null 2>&1; then exit 0; fi
done
skip() { echo "install_browser.sh: $1; the browser tests will skip"; exit 0; }
command -v apt-get >/dev/null 2>&1 || skip "no apt-get here"
sudo=()
if [ "$(id -u)" != 0 ]; then
  sudo -n true 2>/dev/null || skip "not root and no passwordless sudo"
  sudo=(sudo -n)
fi
"${sudo[@]}" apt-get update -qq >/dev/null 2>&1 || skip "apt-get update failed"
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq chromium \
  >/dev/null 2>&1 || skip "apt-get install chromium failed"
echo "install_browser.sh: installed chromium"
