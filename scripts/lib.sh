# Shared by the scripts in this folder (sourced): installing the Debian packages they need.

# build_missing: the packages the build needs and lacks (the udev crate links libudev).
build_missing() {
  pkg-config --exists libudev 2>/dev/null || echo "libudev-dev pkg-config"
}

# install_missing WHO PACKAGE...: as root, installs the packages (never starting a service while
# doing so); otherwise says what is missing. Nothing to do without packages.
install_missing() {
  local who=$1
  shift
  [ $# -gt 0 ] || return 0
  if [ "$(id -u)" != 0 ]; then
    echo "$who: missing Debian packages $*; run as root to install them" >&2
    return 0
  fi
  echo "$who: installing $*"
  apt-get update -qq
  # policy-rc.d exit 101: no service (prometheus) is started by the install.
  local own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && own_policy=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
  if [ "$own_policy" = 1 ]; then
    rm -f /usr/sbin/policy-rc.d
  fi
}
