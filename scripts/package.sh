#!/usr/bin/env bash
# What an operator installs: the Debian package (static binary, systemd unit, example config as
# a conffile in /etc/headroom, docs) and, where a container engine runs here, the image the
# DaemonSet names (headroom:<version>, FROM scratch). Prints the paths it made.
#
#   bash scripts/package.sh            # .deb and image
#   bash scripts/package.sh --deb      # .deb only
#   bash scripts/package.sh --bin PATH # package this (static) binary instead of building one
#
# The binary is statically linked (glibc, -C target-feature=+crt-static), so the .deb depends on
# nothing and the image needs no base layer. Output: target/package/.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

want_image=1
bin=""
while [ $# -gt 0 ]; do
  case "$1" in
    --deb) want_image=0; shift ;;
    --bin) bin=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "package.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

version=$(cargo metadata --no-deps --format-version 1 |
  grep -o '"name":"headroom","version":"[^"]*"' | sed 's/.*"version":"//; s/"//')
[ -n "$version" ] || { echo "package.sh: cannot read the headroom crate's version" >&2; exit 1; }
out=$repo/target/package
mkdir -p "$out"

if [ -z "$bin" ]; then
  RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release -p headroom --bin headroom --target x86_64-unknown-linux-gnu >&2
  bin=$repo/target/x86_64-unknown-linux-gnu/release/headroom
fi
# A static(-pie) binary has no shared library to resolve: ldd lists no `=>`.
if ldd "$bin" 2>&1 | grep -q '=>'; then
  echo "package.sh: $bin is dynamically linked; the package and the image need a static binary" >&2
  exit 1
fi

# --- the .deb ----------------------------------------------------------------------------------
command -v dpkg-deb >/dev/null 2>&1 || { echo "package.sh: dpkg-deb missing (apt-get install dpkg)" >&2; exit 1; }
tree=$(mktemp -d "$out/deb.XXXXXX")
trap 'rm -rf "$tree"' EXIT
install -d "$tree/DEBIAN" "$tree/usr/bin" "$tree/lib/systemd/system" "$tree/etc/headroom" \
  "$tree/usr/share/doc/headroom"
strip -o "$tree/usr/bin/headroom" "$bin" 2>/dev/null || cp "$bin" "$tree/usr/bin/headroom"
chmod 755 "$tree/usr/bin/headroom"
install -m 644 deploy/headroom.service "$tree/lib/systemd/system/headroom.service"
install -m 644 deploy/headroom.toml "$tree/etc/headroom/headroom.toml"
for d in agent host kubernetes operators policies; do
  [ -f "docs/$d.md" ] && install -m 644 "docs/$d.md" "$tree/usr/share/doc/headroom/$d.md"
done
install -m 644 deploy/grafana/headroom.json "$tree/usr/share/doc/headroom/grafana-headroom.json"
printf 'headroom %s\nLicense: see the headroom source repository (Cargo.toml license field).\n' \
  "$version" > "$tree/usr/share/doc/headroom/copyright"
size_kib=$(du -sk --exclude=DEBIAN "$tree" | cut -f1)
sed "s/@VERSION@/$version/; s/@SIZE@/$size_kib/" deploy/debian/control > "$tree/DEBIAN/control"
install -m 644 deploy/debian/conffiles "$tree/DEBIAN/conffiles"
for s in postinst prerm postrm; do install -m 755 "deploy/debian/$s" "$tree/DEBIAN/$s"; done
deb=$out/headroom_${version}_amd64.deb
dpkg-deb --root-owner-group --build "$tree" "$deb" >/dev/null
echo "deb: $deb"

# --- the image ---------------------------------------------------------------------------------
[ $want_image = 1 ] || exit 0
engine=""
for e in podman buildah docker; do
  if command -v "$e" >/dev/null 2>&1 && "$e" info >/dev/null 2>&1; then engine=$e; break; fi
done
if [ -z "$engine" ]; then
  echo "image: not built: no container engine runs here (apt-get install podman)" >&2
  exit 0
fi
# The Dockerfile's final stage with the binary built above standing in for its build stage.
ctx=$(mktemp -d "$out/image.XXXXXX")
trap 'rm -rf "$tree" "$ctx"' EXIT
mkdir -p "$ctx/out"
cp "$tree/usr/bin/headroom" "$ctx/out/headroom"
cp deploy/headroom.toml "$ctx/out/headroom.toml"
tag=headroom:$version
case $engine in
  podman|docker)
    "$engine" build -q --build-context "build=$ctx" --target runtime -f deploy/Dockerfile -t "$tag" "$ctx" >&2 ;;
  buildah)
    buildah bud -q --build-context "build=$ctx" --target runtime -f deploy/Dockerfile -t "$tag" "$ctx" >&2 ;;
esac
archive=$out/headroom_${version}_image.tar
rm -f "$archive"
"$engine" save -o "$archive" "$tag" >&2
echo "image: $tag ($engine; archive $archive)"
