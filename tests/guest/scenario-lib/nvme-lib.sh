# The NVMe/TCP scenarios' start, sourced as /extra/lib/nvme-lib.sh (busybox sh, after `set -eu`):
# loads transport-lib.sh (the image's, or a modified copy shipped as
# /extra/lib/transport-lib.sh) and the nvmet/NVMe-TCP modules; prints SKIPPED and exits 0 when
# the image lacks one of them or nvme-cli. Defines `state CTRL` (the controller's state, `gone`
# once it is).
TL=/usr/lib/blockjanitor/transport-lib.sh
[ -e /extra/lib/transport-lib.sh ] && TL=/extra/lib/transport-lib.sh
[ -e $TL ] || { echo "SKIPPED: the guest image has no transport-lib.sh (the 'guest image:' commit adds it)"; exit 0; }
for m in nvmet nvmet_tcp nvme_tcp; do
  modprobe $m 2>/dev/null || { echo "SKIPPED: the guest image has no $m module (the 'guest image:' commit adds it)"; exit 0; }
done
command -v nvme >/dev/null || { echo "SKIPPED: the guest image has no nvme-cli"; exit 0; }
set +u
. $TL
set -u
state() { cat /sys/class/nvme/$1/state 2>/dev/null || echo gone; }
