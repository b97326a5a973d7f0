#!/usr/bin/env bash
# Build gannet's Debian package from a binary already built (test-all.sh builds the
# release one): write the gzipped manual page `gannet --man` prints where the package
# metadata (crates/gannet/Cargo.toml, [package.metadata.deb]) expects it, then
# `cargo deb --no-build`. Extra arguments go to cargo deb, e.g. `--deb-version 0.1.0-2`,
# `--output DIR`, `--profile dev` (package the debug build, for quick local runs).
# Prints the path of the .deb.
#   packaging/build-deb.sh [--profile release|dev] [cargo deb arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
if [ "${1:-}" = --profile ]; then
  profile=$2
  shift 2
fi
dir=$profile
[ "$profile" = dev ] && dir=debug
target="${CARGO_TARGET_DIR:-$PWD/target}"
bin="$target/$dir/gannet"
if [ ! -x "$bin" ]; then
  echo "build-deb.sh: $bin not found: cargo build --profile $profile -p gannet first" >&2
  exit 1
fi
if ! command -v cargo-deb >/dev/null; then
  echo "build-deb.sh: cargo-deb not found: cargo install cargo-deb" >&2
  exit 1
fi
mkdir -p "$target/$dir/man"
# -n: no name or time stamp in the gzip header, so the same page gives the same bytes.
"$bin" --man | gzip -9n > "$target/$dir/man/gannet.8.gz"
cargo deb -p gannet --no-build --profile "$profile" "$@"
