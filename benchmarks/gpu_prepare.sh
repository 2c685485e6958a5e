#!/usr/bin/env bash
# Prepares, on the CPU machine and at no device time, what every call of benchmarks/gpu_report.sh
# carries to the lent GPU (docs/benchmarks.md, "The device runbook"):
#   .whl/  wheels for Python 3.12 of what the project needs and the device image lacks
#   .gpu/  the Multi30k and WMT14 test data, the side-by-side bench and (if given) Flax's example
# Both folders are ignored through .git/info/exclude; a session's checkout starts without them.
#
#   bash benchmarks/gpu_prepare.sh [FLAX_GIT_DIR]
#
# FLAX_GIT_DIR: a google/flax git directory (what the `fetch` tool returns); its examples/wmt is
# extracted, unchanged, into .gpu/examples/wmt for the sbs_* items. Without it those items skip.
# The image's package list is read from the device tool's KINDS.md ($KINDS_MD), so what the
# image already holds is never carried: the wheels are the resolution of pyproject.toml's
# dependencies (and CTranslate2, for the ct2 items) for CPython 3.12 on manylinux x86-64, less
# the image's packages. Rerunning it replaces both folders; a run that fails leaves the last ones.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
# pip's notes on this machine's index folders say nothing about the result.
exec 2> >(grep -v --line-buffered "^WARNING: Location 'file://" >&2)
KINDS_MD=${KINDS_MD:-../.library/device/KINDS.md}
DATA=${DATA:-../shared/data}
CT2=${CT2:-ctranslate2==4.8.5}
# Carried even though the image holds them: the protobuf runtime must be as new as the gencode of
# tensorflow-metadata's protos (the image's may be older); the last GPU calls carried it too.
ALWAYS_CARRY=${ALWAYS_CARRY:-protobuf}
FLAX_GIT_DIR=${1:-}

die() { echo "gpu_prepare: $*" >&2; exit 2; }
[ -f "$KINDS_MD" ] || die "$KINDS_MD not found: set KINDS_MD to the device tool's KINDS.md."
[ -d "$DATA/multi30k" ] || die "$DATA/multi30k not found: set DATA to the shared data folder."
if [ -n "$FLAX_GIT_DIR" ]; then
  git --git-dir="$FLAX_GIT_DIR" rev-parse --verify -q HEAD >/dev/null 2>&1 \
    || die "$FLAX_GIT_DIR is not a git directory (pass what \`fetch github:google/flax\` returned)."
fi

# The image's packages, normalized (PEP 503): the line "nvidia-h200: their image ... Packages: ...".
image=$(grep -m1 '^nvidia-h200: their image' "$KINDS_MD" | sed -n 's/.*Packages: //p' \
  | tr -d '.' | tr ',' '\n' | sed 's/^ *//; s/ *$//' | tr 'A-Z_.' 'a-z--' | sort -u)
[ -n "$image" ] || die "$KINDS_MD has no 'nvidia-h200: their image ... Packages:' line."

mkdir -p .git/info
for folder in /.whl/ /.gpu/; do
  grep -qxF "$folder" .git/info/exclude 2>/dev/null || echo "$folder" >> .git/info/exclude
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# Built aside and swapped in at the end: a failure leaves the last good folders in place.
WHL=$TMP/whl GPU=$TMP/gpu
mkdir -p "$WHL" "$GPU/data" "$GPU/bench"

# pyproject.toml's runtime dependencies, and CTranslate2.
python3 - "$CT2" > "$TMP/requirements.txt" <<'EOF'
import sys, tomllib
with open("pyproject.toml", "rb") as f:
  print("\n".join(tomllib.load(f)["project"]["dependencies"] + [sys.argv[1]]))
EOF

platforms=()
for n in 39 35 34 31 28 27 24 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
target=(--python-version 3.12 --implementation cp "${platforms[@]}")

# Packages published only as source (tensorflow-datasets' `promise`) become wheels here first, so
# the resolution below can stay binary-only, as pip requires for a foreign interpreter.
for sdist_only in promise; do
  python3 -m pip wheel -q --no-deps --no-binary :all: -w "$TMP/built" "$sdist_only" \
    || die "could not build a wheel of $sdist_only."
done

echo "gpu_prepare: resolving pyproject.toml's dependencies for CPython 3.12 ..."
python3 -m pip install -q --dry-run --ignore-installed --only-binary=:all: "${target[@]}" \
  --target "$TMP/none" --find-links "$TMP/built" --report "$TMP/report.json" \
  -r "$TMP/requirements.txt" || die "pip could not resolve the dependencies for Python 3.12."
python3 - "$TMP/report.json" > "$TMP/resolved.txt" <<'EOF'
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
  meta = item["metadata"]
  print(meta["name"].lower().replace("_", "-").replace(".", "-"), meta["version"])
EOF

carried=0
while read -r name version; do
  if grep -qxF "$name" <<< "$image" && ! grep -qw -- "$name" <<< "$ALWAYS_CARRY"; then continue; fi
  if ls "$TMP/built/" 2>/dev/null | grep -qi "^${name//-/_}-$version-"; then
    cp "$TMP/built/"*.whl "$WHL"/ 2>/dev/null || true
  else
    python3 -m pip download -q --no-deps --only-binary=:all: "${target[@]}" -d "$WHL" \
      "$name==$version" || die "no Python 3.12 wheel of $name==$version."
  fi
  carried=$((carried + 1))
done < "$TMP/resolved.txt"
# Only the wheels of the carried packages (the built ones were copied as a set).
python3 - "$WHL" "$TMP/resolved.txt" <<'EOF'
import pathlib, sys
keep = {line.split()[0] for line in open(sys.argv[2])}
for wheel in pathlib.Path(sys.argv[1]).glob("*.whl"):
  if wheel.name.split("-")[0].lower().replace("_", "-") not in keep:
    wheel.unlink()
EOF

cp -r "$DATA/multi30k" "$GPU/data/"
[ -d "$DATA/wmt14-en-de-test" ] && cp -r "$DATA/wmt14-en-de-test" "$GPU/data/"
cp ../shared/bench/*.py "$GPU/bench/" 2>/dev/null || echo "gpu_prepare: no ../shared/bench: the sbs_* items will skip."
if [ -n "$FLAX_GIT_DIR" ]; then
  # A `fetch` snapshot lacks its largest files, and git archive reports those outside the path
  # too: the check is that every file of examples/wmt came out.
  git --git-dir="$FLAX_GIT_DIR" archive HEAD examples/wmt 2> "$TMP/archive.err" | tar -x -C "$GPU"
  git --git-dir="$FLAX_GIT_DIR" ls-tree -r --name-only HEAD examples/wmt | sort > "$TMP/wmt.want"
  (cd "$GPU" && find examples/wmt -type f | sort) > "$TMP/wmt.got"
  cmp -s "$TMP/wmt.want" "$TMP/wmt.got" \
    || die "examples/wmt did not come out whole from $FLAX_GIT_DIR: $(cat "$TMP/archive.err")"
  echo "gpu_prepare: Flax's examples/wmt at $(git --git-dir="$FLAX_GIT_DIR" rev-parse --short HEAD) in .gpu/examples/wmt."
fi

size=$(du -sm "$WHL" "$GPU" | awk '{s += $1} END {print s}')
(( size <= 64 )) || die "the two folders would hold ${size} MB, more than a call carries."
rm -rf .whl .gpu
mv "$WHL" .whl
mv "$GPU" .gpu
echo "gpu_prepare: $carried packages in .whl ($(ls .whl | wc -l) wheels), .gpu ready; ${size} MB to carry (64 MiB a call at most)."
echo 'gpu_prepare: each call: run(command="bash benchmarks/gpu_report.sh ITEM ...", carry=[".whl", ".gpu"]).'
