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
# Speed benchmark (issue 7), chunks from the training-first split .wh/s1..sN:
#   bash scripts/gpu_node.sh speed-start [bench args]
#                                                stage s1, install the training subset into
#                                                /tmp/site-train, start fixtures + benchmark in
#                                                the background (setsid; runs while warm)
#   bash scripts/gpu_node.sh stage s2; ... stage s3 && bash scripts/gpu_node.sh install
#                                                (install also releases the pipeline's widen stage)
#   bash scripts/gpu_node.sh speed-wait [SECS]   watch; fixture manifest + results -> $OUT
#   bash scripts/gpu_node.sh speed-bench [args]  scripts/bench_speed.py -> $OUT (fixtures ready)
#
# The whole GPU suite with the seed case (issue 11), chunks from the training-first split:
#   bash scripts/gpu_node.sh suite-start [pytest args]
#                                                stage s1, install the training subset, start
#                                                make_fixtures (bf16 reference) || make_mla_fixtures,
#                                                then (after `install`) the patched copy and
#                                                pytest -m gpu, detached
#   bash scripts/gpu_node.sh stage s2 ...; stage sN && bash scripts/gpu_node.sh install
#   bash scripts/gpu_node.sh suite-wait [SECS]   watch; results + fixture manifests -> $OUT
#
# Files larger than a call (the unstripped sglang-kernel with FA3 + FlashMLA, torch 2.14.1):
#   python scripts/ferry.py split FILE           here; then one call per part, back to back:
#   bash scripts/gpu_node.sh ferry-recv          carry .ferry/FILE/part-KK + .ferry/FILE/manifest.json
#   bash scripts/gpu_node.sh ferry-join LOCK     every complete file into /tmp/wh, checked against
#                                                LOCK (sha256 or upstream-sha256); a stripped copy
#                                                of the same name is set aside, then `install`
#
# Wheel chunks come from: python scripts/wheelhouse.py build --profile h200-cu130-py312 --out .wh
set -euo pipefail
WH=/tmp/wh SITE=/tmp/site FIX=/tmp/fixtures LOGS=/tmp/sglang-ext-logs MLA=/tmp/mla SUITE=/tmp/suite
SPEED=/tmp/speed TRAIN_SITE=/tmp/site-train INSTALLED=/tmp/sglang-installed
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

# The detached pipelines run from their own copy: each device call re-syncs the checkout.
copy_repo() {
    rm -rf /tmp/repo && mkdir /tmp/repo && cp -r scripts sglang_ext sglang_ext_tools tests patches pyproject.toml /tmp/repo/
}
# Stage the training subset, copy the checkout and start `gpu_node.sh PIPELINE` from the copy
# in a new session (it outlives this call), its log in DIR/pipeline.log; the remaining
# arguments reach it through the variable VAR.
start_detached() {
    local pipeline=$1 dir=$2 var=$3
    shift 3
    mkdir -p "$dir"
    train_site
    copy_repo
    env "$var=$*" setsid nohup bash /tmp/repo/scripts/gpu_node.sh "$pipeline" \
        >"$dir/pipeline.log" 2>&1 </dev/null &
    sleep 2
    cat "$dir/pipeline.log"
}
# The training subset (chunk s1) into its own site, so fixtures start before SGLang is in.
train_site() {
    mkdir -p "$WH" && cp .wh/s1/*.whl "$WH"/
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$TRAIN_SITE" \
        .wh/s1/*.whl
}

step=${1:?usage: gpu_node.sh stage|install|fixtures|patched|test}
shift
case "$step" in
stage)
    mkdir -p "$WH"
    for chunk in "$@"; do cp .wh/"$chunk"/*.whl "$WH"/; done
    echo "staged: $(find "$WH" -name '*.whl' | wc -l) wheels, $(du -sh "$WH" | cut -f1)"
    ;;
ferry-recv)
    mkdir -p /tmp/ferry && cp -r .ferry/. /tmp/ferry/
    for manifest in /tmp/ferry/*/manifest.json; do
        python3 scripts/ferry.py status "$manifest" || true
    done
    ;;
ferry-join)
    lock=${1:?usage: gpu_node.sh ferry-join LOCK}
    mkdir -p "$WH"
    for manifest in /tmp/ferry/*/manifest.json; do
        name=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["file"])' "$manifest")
        [ -f "$WH/$name" ] && mv "$WH/$name" "$WH/$name.stripped"
        python3 scripts/ferry.py join "$manifest" --out "$WH" --lock "$lock"
    done
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
    touch "$INSTALLED"
    ;;
suite-start)
    mkdir -p "$SUITE/result"
    start_detached suite-pipeline "$SUITE" SUITE_PYTEST_ARGS "$@"
    ;;
suite-pipeline)
    # (make_fixtures || make_mla_fixtures) -> (after `install`) patched copy -> pytest -m gpu;
    # ends with DONE or FAILED. Runs detached: `suite-wait` only watches.
    cd /tmp/repo
    # dsv3 (a random MLA target) gave way to make_mla_fixtures' trained one.
    PYTHONPATH="$TRAIN_SITE" python3 scripts/make_fixtures.py --out "$FIX" --scale full \
        --device cuda --ref-dtype bfloat16 --overwrite \
        --variants llama,llama3layer,random,qwen3,sglang4layer >"$SUITE/fixtures.log" 2>&1 &
    p1=$!
    PYTHONPATH="$TRAIN_SITE" python3 scripts/make_mla_fixtures.py --stage all --out "$MLA" \
        --device cuda >"$SUITE/mla.log" 2>&1 &
    p2=$!
    ok=1
    wait "$p1" || ok=0
    wait "$p2" || ok=0
    while [ ! -f "$INSTALLED" ]; do sleep 2; done
    if [ "$ok" = 1 ]; then
        bash scripts/gpu_node.sh patched 0.5.17 >"$SUITE/patched.log" 2>&1 || true
        # shellcheck disable=SC2086  # pytest flags, split on purpose
        OUT="$SUITE/result" SGLANG_EXT_MLA_FIXTURES="$MLA" timeout -s INT "${SUITE_LIMIT:-900}" \
            bash scripts/gpu_node.sh test ${SUITE_PYTEST_ARGS:-} || true
        touch "$SUITE/DONE"
    else
        touch "$SUITE/FAILED"
    fi
    ;;
suite-wait)
    limit=${1:-540}
    for _ in $(seq "$limit"); do
        if [ -f "$SUITE/DONE" ] || [ -f "$SUITE/FAILED" ]; then break; fi
        sleep 1
    done
    grep -h "make_fixtures\|Error\|error" "$SUITE"/fixtures.log "$SUITE"/mla.log 2>/dev/null | tail -n 20
    tail -n 25 "$SUITE/result/pytest.log" 2>/dev/null
    cp "$FIX/fixtures.json" "$MLA/mla-fixtures.json" "$OUT"/ 2>/dev/null || true
    cp "$SUITE"/result/integration-*.json "$SUITE/result/pytest.log" "$OUT"/ 2>/dev/null || true
    tar -czf "$OUT/suite-logs.tgz" -C "$SUITE" pipeline.log fixtures.log mla.log patched.log \
        result/logs.tgz 2>/dev/null || true
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
    [ -f "$SUITE/DONE" ]
    ;;
speed-start)
    start_detached speed-pipeline "$SPEED" SPEED_BENCH_ARGS "$@"
    ;;
speed-pipeline)
    # base -> (after `install`) widen-target || drafter nbr=true || drafter nbr=false
    #      -> widen-drafters -> speed-bench; ends with DONE or FAILED. Runs detached, so no
    # idle gap between device calls can lose it: `speed-wait` only watches.
    cd /tmp/repo
    run() { PYTHONPATH="$1" python3 scripts/make_speed_fixtures.py --out "$SPEED" "${@:2}"; }
    ok=0
    if run "$TRAIN_SITE" --stage base; then
        while [ ! -f "$INSTALLED" ]; do sleep 2; done
        run "$SITE" --stage widen-target >"$SPEED/widen-target.log" 2>&1 &
        p0=$!
        run "$SITE" --stage drafter --nbr true >"$SPEED/drafter-true.log" 2>&1 &
        p1=$!
        run "$SITE" --stage drafter --nbr false >"$SPEED/drafter-false.log" 2>&1 &
        p2=$!
        if wait "$p0" && wait "$p1" && wait "$p2" && run "$SITE" --stage widen-drafters; then
            ok=1
        fi
    fi
    if [ "$ok" = 1 ]; then
        # shellcheck disable=SC2086  # bench flags, split on purpose
        OUT="$SPEED/result" PYTHONPATH="$SITE" timeout -s INT "${SPEED_BENCH_LIMIT:-560}" \
            bash scripts/gpu_node.sh speed-bench ${SPEED_BENCH_ARGS:-} || true
        touch "$SPEED/DONE"
    else
        touch "$SPEED/FAILED"
    fi
    ;;
dummy-profile-start)
    # Stock SGLang, dummy 8B-shaped weights, tau ~ 1: where a verify cycle's time goes.
    mkdir -p "$WH" && cp .wh/s1/*.whl "$WH"/
    copy_repo
    setsid nohup bash /tmp/repo/scripts/gpu_node.sh dummy-profile >/tmp/dummy.log 2>&1 \
        </dev/null &
    ;;
dummy-profile)
    cd /tmp/repo
    while [ ! -f "$INSTALLED" ]; do sleep 2; done
    python3 scripts/make_dummy_8b.py /tmp/dummy
    SGLANG_PLUGINS=__no_plugin__ timeout -s INT 400 python3 scripts/bench_speed.py \
        --target /tmp/dummy/target --drafter /tmp/dummy/drafter \
        --prompts /tmp/dummy/prompts.jsonl --settings 5,1,6 --batches 1 --rounds 1 \
        --max-new-tokens 128 --mem-fraction 0.95 --max-total-tokens 8192 \
        --server-args "--load-format dummy" --startup-timeout 200 --profile \
        --log-dir /tmp/dummy/logs --profile-dir /tmp/dummy/profiles \
        --out-json /tmp/dummy/speed-dummy.json || true
    touch /tmp/dummy/DONE
    ;;
dummy-profile-wait)
    for _ in $(seq "${1:-300}"); do [ -f /tmp/dummy/DONE ] && break; sleep 1; done
    tail -n 30 /tmp/dummy.log
    cp /tmp/dummy/speed-dummy.json "$OUT"/ 2>/dev/null || true
    find /tmp/dummy/profiles -name '*.trace.json.gz' -size -15M -exec cp {} "$OUT"/ \; 2>/dev/null
    tar -czf "$OUT/dummy-logs.tgz" -C /tmp/dummy/logs . 2>/dev/null || true
    [ -f /tmp/dummy/DONE ]
    ;;
speed-wait)
    limit=${1:-540}
    for _ in $(seq "$limit"); do
        if [ -f "$SPEED/DONE" ] || [ -f "$SPEED/FAILED" ]; then break; fi
        sleep 1
    done
    tail -n 3 "$SPEED"/*.log 2>/dev/null | grep -v Warning
    tail -n 25 "$SPEED/result/bench.log" 2>/dev/null
    cp "$SPEED"/stage-*.json "$SPEED"/speed-fixtures.json "$OUT"/ 2>/dev/null || true
    cp "$SPEED"/result/speed.json "$SPEED"/result/speed.png "$OUT"/ 2>/dev/null || true
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
    [ -f "$SPEED/DONE" ]
    ;;
speed-bench)
    mkdir -p "$OUT"
    python3 scripts/bench_speed.py --target "$SPEED/target-8b" \
        --drafter "$SPEED/drafter-8b-nbr-true" \
        --drafter-nbr-false "$SPEED/drafter-8b-nbr-false" \
        --drafter-nbr-false-sglang "$SPEED/drafter-8b-nbr-false-sglang" \
        --prompts "$SPEED/prompts.jsonl" --fixtures-json "$SPEED/speed-fixtures.json" \
        --log-dir "$LOGS" --out-json "$OUT/speed.json" --out-png "$OUT/speed.png" "$@" \
        2>&1 | tee "$OUT/bench.log"
    status=${PIPESTATUS[0]}
    tar -czf "$OUT/server-logs.tgz" -C "$LOGS" . 2>/dev/null
    exit "$status"
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
