#!/usr/bin/env bash
# Proves the README's commands on a brand-new Debian 12 system: builds a minimal bookworm root with
# mmdebstrap (cached), clones the committed HEAD into it and runs `make TARGET` there as root, with
# an empty environment. Packages installed on this machine by hand are not there, so a missing step
# in scripts/setup.sh fails here rather than on a user's machine. Needs root (chroot, mounts).
#
#   bash scripts/fresh-root.sh [test|demo|build]    # default: test (make fresh-test / fresh-demo)
#   KEEP=1 bash scripts/fresh-root.sh               # keep the root afterwards
set -euo pipefail
target=${1:-test}
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/hyla-fresh-root
mkdir -p "$cache"
if [[ $(id -u) -ne 0 ]]; then echo "fresh-root: needs root (chroot and mounts)" >&2; exit 2; fi
if ! command -v mmdebstrap >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
fi

base="$cache/bookworm-minbase.tar"
if [[ ! -s $base ]]; then
  echo "fresh-root: making a minimal Debian 12 root (cached in $cache)"
  # This machine's package sources (either file may be absent), so the new root reaches the
  # archive the way this one does. mmdebstrap picks the output format from the name: the partial
  # file ends in .tar too.
  sources="$cache/sources"
  cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list >"$sources" 2>/dev/null || true
  mmdebstrap --quiet --variant=minbase --include=make,git,ca-certificates bookworm "$cache/partial.tar" <"$sources"
  mv "$cache/partial.tar" "$base"
fi

root=$(mktemp -d "$cache/root.XXXXXX")
unmount_and_remove() {
  for m in dev/pts dev sys proc; do umount -l "$root/$m" 2>/dev/null || true; done
  if [[ -n ${KEEP:-} ]]; then echo "fresh-root: kept $root"; else rm -rf "$root"; fi
}
trap unmount_and_remove EXIT
tar -xf "$base" -C "$root"
cp /etc/resolv.conf "$root/etc/" 2>/dev/null || true
# Extra certificate authorities this machine trusts (a registry proxy's) are part of its network.
if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null 2>&1 || true
fi
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
git clone -q "$repo" "$root/src/hyla"

network_env=()
for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY NODE_EXTRA_CA_CERTS SSL_CERT_FILE; do
  if [[ -n ${!v:-} ]]; then network_env+=("$v=${!v}"); fi
done
echo "fresh-root: make $target in a new Debian 12 root ($(git -C "$repo" rev-parse --short HEAD))"
start=$SECONDS
rc=0
chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
  "${network_env[@]}" bash -c "cd /src/hyla && make $target" || rc=$?
echo "fresh-root: make $target exited $rc after $((SECONDS - start)) s"
exit $rc
