#!/usr/bin/env bash
# Install the system packages the test suite needs beyond pip: Debian's headless-capable
# Chromium, used by tests/integration/test_report*.py to render the run report.
# Idempotent: does nothing when /usr/bin/chromium already exists.
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
    echo "install_test_deps: /usr/bin/chromium present, nothing to do"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends chromium fonts-dejavu-core
/usr/bin/chromium --version
