#!/usr/bin/env bash
# What a device session carries, built here in a new checkout (docs/performance.md,
# "Reproduce on one nvidia-h200"): the 0.5.23 lock's wheel set as one tar in 40 MB ferry parts
# (.ferry/wheels523.tar/) and the training chunk .wh/s1 (wheelhouse.TRAINING_FIRST: the set's
# training wheels plus speculators 0.9.0 and its needs). Each step whose output is already
# there is skipped, so a second run after an interrupted one finishes the rest; nothing that
# exists is rewritten. ~3 minutes from the package index (on 2026-12-06, 17th session).
#
#   bash node/prepare_session.sh [PYTHON]      # PYTHON: one with pip (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-python3}
lock=node/locks/sglang-0.5.23-h200-cu130-py312.lock

if [ ! -d .wh523 ]; then
    "$py" node/wheelhouse.py build --lock "$lock" --out .wh523 --ferry-large
fi
if [ ! -f .ferry/wheels523.tar/manifest.json ]; then
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/b/523"
    cp -r .wh523/c* .wh523/big "$stage/b/523/"
    tar -cf "$stage/wheels523.tar" -C "$stage/b" 523
    "$py" node/ferry.py split "$stage/wheels523.tar"
fi
if [ ! -d .wh/s1 ]; then
    mkdir -p .wh/c9
    for w in speculators==0.9.0 hs-connectors datasets==5.1.0 multiprocess \
        pydantic-settings python-dotenv tokenizers==0.23.2; do
        "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .wh/c9 "$w"
    done
    for n in transformers- annotated_types dill distro jiter loguru openai- pydantic- \
        pydantic_core sniffio typing_inspection; do
        cp .wh523/*/"${n}"*.whl .wh/c9/
    done
    "$py" node/wheelhouse.py split .wh
fi
du -sh .wh/s1 .ferry/wheels523.tar
