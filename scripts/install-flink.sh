#!/usr/bin/env bash
# Installs Apache Flink 2.3.0's jars for the Flink operator (flink/): the wheel
# apache-flink-libraries==2.3.0 from the Python package registry, checked against its sha256,
# with the jars of its pyflink/lib/ unzipped into a cache folder. Idempotent: a second run finds
# the jars and does nothing. Prints the folder the jars are in.
#
#   scripts/install-flink.sh            # into ${TALLY_FLINK_HOME:-$HOME/.cache/tally/flink-2.3.0}
set -euo pipefail
cd "$(dirname "$0")/.."

home="${TALLY_FLINK_HOME:-${HOME:-/root}/.cache/tally/flink-2.3.0}"
lib="$home/lib"
if [ -f "$lib/.complete" ] && command -v javac >/dev/null; then
  echo "$lib"
  exit 0
fi

if ! command -v javac >/dev/null; then
  echo "installing a JDK (javac) from Debian's packages" >&2
  apt-get update -qq >&2 && apt-get install -y -qq openjdk-17-jdk-headless >&2
fi

mkdir -p "$home"
wheels="$home/wheel"
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --require-hashes -r flink/requirements.txt -d "$wheels" >&2
wheel=$(ls "$wheels"/apache_flink_libraries-2.3.0-*.whl)
rm -rf "$lib.partial"
mkdir -p "$lib.partial"
python3 - "$wheel" "$lib.partial" <<'PY'
import sys, zipfile, os
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith("pyflink/lib/") and name.endswith(".jar"):
            with z.open(name) as src, open(os.path.join(out, os.path.basename(name)), "wb") as dst:
                dst.write(src.read())
PY
touch "$lib.partial/.complete"
rm -rf "$lib"
mv "$lib.partial" "$lib"
rm -rf "$wheels"
echo "$lib"
