#!/usr/bin/env bash
# Prints the path of a CPython interpreter of the version asked for (e.g. `3.13`), building one
# from source when this machine has none.
#
# The current profile runs on Python 3.13, which Debian 12 does not package. Where to look, in
# order: `python3.13` on PATH; pyenv's interpreters; this cache; else CPython from Debian 13's
# (trixie's) source package, fetched with apt through a private deb-src list (the system's apt
# sources are left alone) and built the way pyenv builds CPython (configure, make, make
# install, no PGO), once, into the cache keyed by the full version: a second set-up finds it.
# HVDFLOW_BUILD_PYTHON=1 skips the first two places (to test the build). Progress goes to stderr.
set -euo pipefail

want=${1:?usage: scripts/python.sh 3.13}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/hvdflow/python
DEBIAN_SUITE=${HVDFLOW_PYTHON_SUITE:-trixie}
log() { printf '[python] %s\n' "$*" >&2; }

is_version() { "$1" -c "import sys; sys.exit(f'{sys.version_info[0]}.{sys.version_info[1]}' != '$want')" 2>/dev/null; }

if [ "${HVDFLOW_BUILD_PYTHON:-0}" != 1 ]; then
  for candidate in "$(command -v "python$want" || true)" \
                   "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$want".*/bin/python"$want"; do
    if [ -x "$candidate" ] && is_version "$candidate" \
       && "$candidate" -c 'import ssl, sqlite3, lzma, bz2, ctypes, venv' 2>/dev/null; then
      echo "$candidate"
      exit 0
    fi
  done
fi
for candidate in "$CACHE"/"$want".*/bin/python"$want"; do
  if [ -x "$candidate" ] && is_version "$candidate"; then
    echo "$candidate"
    exit 0
  fi
done

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  log "no Python $want here, and building one needs root and apt: install Python $want and"
  log "run again with PYTHON_CURRENT=/path/to/python$want"
  exit 1
fi

# A private apt state: one deb-src entry for the suite that packages this Python.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/src"
cat >"$work/sources.list" <<EOF
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $DEBIAN_SUITE main
EOF
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
          -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -qq
          # Root downloads into the private folders (apt's _apt user could not write there).
          -o "APT::Sandbox::User=root")
log "fetching the python$want source package from Debian $DEBIAN_SUITE"
apt-get "${apt_opts[@]}" update >&2
(cd "$work/src" && apt-get "${apt_opts[@]}" source --download-only "python$want" >&2)
orig=$(ls "$work"/src/python"$want"_*.orig.tar.xz | head -1)
full=$(basename "$orig" .orig.tar.xz)
full=${full#python"$want"_}
log "building CPython $full (once, into $CACHE/$full; about 3 minutes on 2 cores)"
tar -xJf "$orig" -C "$work/src"
src=$(find "$work/src" -maxdepth 1 -type d -name "Python-$full*" | head -1)
prefix="$CACHE/.partial-$full-$$"
(
  cd "$src"
  ./configure --prefix="$CACHE/$full" --with-ensurepip=install >"$work/build.log" 2>&1
  make -j"$(nproc)" >>"$work/build.log" 2>&1
  make install DESTDIR="$prefix" >>"$work/build.log" 2>&1
) || { tail -40 "$work/build.log" >&2; log "building CPython $full failed (log above)"; exit 1; }
# Publish atomically: a build that dies half way must not look like a cached interpreter.
# DESTDIR holds the tree under its full prefix path; move that tree into place.
mkdir -p "$CACHE"
mv -T "$prefix/$CACHE/$full" "$CACHE/$full" 2>/dev/null || true
rm -rf "$prefix"
python="$CACHE/$full/bin/python$want"
"$python" -c 'import ssl, sqlite3, lzma, bz2, ctypes, venv' \
  || { log "CPython $full built without a module hvdflow needs"; exit 1; }
log "built $python"
echo "$python"
