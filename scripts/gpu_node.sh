#!/usr/bin/env bash
# The GPU-node procedure, one subcommand per step (each fits one `device` call; the machine
# keeps /tmp while it stays warm). Air-gapped H200 node: Python 3.12 with torch preinstalled.
#
#   bash scripts/gpu_node.sh stage c1 [c2 ...]   copy carried wheel chunks (.wh/cN) to /tmp/wh
#   bash scripts/gpu_node.sh install             pip --target /tmp/site: wheels + this project
#   bash scripts/gpu_node.sh fixtures [args]     train the fixtures into /tmp/fixtures
#   bash scripts/gpu_node.sh patched VERSION     patched copy of SGLang in /tmp/site_patched
#   bash scripts/gpu_node.sh test [pytest args]  pytest -m gpu tests/gpu (results -> $OUT)
#
# Wheel chunks come from: python scripts/wheelhouse.py build --profile h200-cu130-py312 --out .wh
set -euo pipefail
WH=/tmp/wh SITE=/tmp/site FIX=/tmp/fixtures LOGS=/tmp/sglang-ext-logs
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

step=${1:?usage: gpu_node.sh stage|install|fixtures|patched|test}
shift
case "$step" in
stage)
    mkdir -p "$WH"
    for chunk in "$@"; do cp .wh/"$chunk"/*.whl "$WH"/; done
    echo "staged: $(find "$WH" -name '*.whl' | wc -l) wheels, $(du -sh "$WH" | cut -f1)"
    ;;
install)
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "$WH"/*.whl
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target "$SITE" .
    python3 - <<'PY'
import importlib.metadata as md, json, torch
names = ("sglang", "sglang-ext", "transformers", "tokenizers", "speculators", "sglang-kernel",
         "flashinfer-python")
print(json.dumps({n: md.version(n) for n in names} | {"torch": torch.__version__,
      "cuda": torch.cuda.is_available(), "gpus": torch.cuda.device_count()}))
print([ep.name for ep in md.entry_points(group="sglang.srt.plugins")])
PY
    ;;
fixtures)
    python3 scripts/make_fixtures.py --out "$FIX" --scale full --device cuda "$@" 2>&1 | tee "$OUT/fixtures.log"
    cp "$FIX/fixtures.json" "$OUT/"
    ;;
patched)
    version=${1:?sglang version of the series}
    rm -rf /tmp/site_patched && mkdir -p /tmp/site_patched
    cp -r "$SITE/sglang" /tmp/site_patched/
    python3 scripts/apply_patches.py apply --sglang-site /tmp/site_patched --series "patches/v$version"
    ;;
test)
    [ -d /tmp/site_patched/sglang ] && export SGLANG_EXT_PATCHED_SITE=/tmp/site_patched
    set +e
    SGLANG_EXT_FIXTURES="$FIX" SGLANG_EXT_RESULTS_DIR="$OUT" SGLANG_EXT_LOG_DIR="$LOGS" \
        python3 -m pytest -m gpu tests/gpu -q -rA -p no:cacheprovider "$@" 2>&1 | tee "$OUT/pytest.log"
    status=${PIPESTATUS[0]}
    tar -czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null
    exit "$status"
    ;;
*)
    echo "unknown step: $step" >&2
    exit 2
    ;;
esac
