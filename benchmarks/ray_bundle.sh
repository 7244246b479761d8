#!/bin/bash
# Ray for the GPU machine (no package index there): Ray's Python 3.12 wheel is over the 64 MiB that `run` carries,
# so this puts a trimmed copy of its core (no rllib, data, serve, train, tune, llm, jars, dashboard client:
# 28 MB as .tar.xz) and its pure dependencies into .raypkg/, which git ignores. Run from the project root:
#
#     benchmarks/ray_bundle.sh            # once, here
#     # on the GPU machine, after the README's prefix (carry [".whl", ".raypkg"]):
#     python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .raypkg/*.whl
#     tar xJf .raypkg/ray-trim.tar.xz -C /tmp/site && export RAY_AUTH_MODE=disabled
set -euo pipefail
version="${RAY_VERSION:-2.60.0}"
root="$(pwd)"
mkdir -p .raypkg
exclude=$(git rev-parse --git-path info/exclude)
grep -qx '/.raypkg/' "$exclude" 2>/dev/null || echo '/.raypkg/' >> "$exclude"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pyplat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux2014_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
python3 -m pip download -q --no-deps "${pyplat[@]}" -d "$work" "ray==$version"
python3 -m pip download -q "${pyplat[@]}" -d .raypkg click filelock jsonschema msgpack packaging protobuf pyyaml requests
(cd "$work" && mkdir x && cd x && python3 -m zipfile -e ../ray-"$version"-*.whl . \
  && rm -rf ray/jars ray/rllib ray/data ray/serve ray/train ray/tune ray/llm ray/dashboard/client \
  && chmod +x ray/core/src/ray/raylet/raylet ray/core/src/ray/gcs/gcs_server \
  && tar cf - ray ray-"$version".dist-info | xz -T0 -6 > "$root/.raypkg/ray-trim.tar.xz")
ls -la .raypkg
