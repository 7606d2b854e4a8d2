#!/usr/bin/env bash
# The GPU-node procedure, one subcommand per step (each fits one `device` call; the machine
# keeps /tmp while it stays warm). Air-gapped H200 node: Python 3.12 with torch preinstalled.
# Run from the repository root; every subcommand of the `case` below is listed here
# (tests/test_node_scripts.py checks that this header and the `case` agree).
#
#   bash node/gpu_node.sh stage c1 [c2 ...]    copy carried wheel chunks (.wh/cN) to /tmp/wh
#   bash node/gpu_node.sh install              pip --target /tmp/site: wheels + this project
#   bash node/gpu_node.sh fixtures [args]      train the fixtures into /tmp/fixtures
#   bash node/gpu_node.sh patched VERSION      patched copy of SGLang in /tmp/site_patched
#   bash node/gpu_node.sh test [pytest args]   pytest -m gpu tests/gpu (results -> $OUT)
#
# Speed benchmark, chunks from the training-first split .wh/s1..sN:
#   bash node/gpu_node.sh speed-start [bench args]
#                                              stage s1, install the training subset into
#                                              /tmp/site-train, start fixtures + benchmark in
#                                              the background (setsid; runs while warm)
#   bash node/gpu_node.sh stage s2; ... stage s3 && bash node/gpu_node.sh install
#                                              (install also releases the pipeline's widen stage)
#   bash node/gpu_node.sh speed-wait [SECS]    watch; fixture manifest + results -> $OUT, and
#                                              the fresh fixtures' bundle parts while the
#                                              bench runs (here: ferry.py collect, below)
#   bash node/gpu_node.sh speed-bench [args]   python -m sglang_ext_tools.bench_speed -> $OUT
#                                              (fixtures ready)
#   bash node/gpu_node.sh speed-pack [FIRST]   the trained small fixtures -> $OUT, three 16 MB
#                                              parts a call (FIRST 0, 3, 6, ...); here they go
#                                              to .ferry/speed-fixtures.tar/, and ferry-recv
#                                              before the next speed-one-start carries them:
#                                              that run only widens them (fixtures.cache)
#   bash node/gpu_node.sh speed-unpack         that step of speed-pipeline: the carried
#                                              bundle into /tmp/speed, widened;
#                                              SPEED_RESUME_STEPS_SCALE=N trains the carried
#                                              nbr=true drafter on first, or
#                                              SPEED_FRESH_DRAFTER_ARGS="FLAGS" trains a new
#                                              one with those flags beside it
#
# The speed benchmark on SGLang 0.5.23 (one nvidia-h200, the ferried wheel set):
#   bash node/gpu_node.sh speed-one-start [bench args]
#                                              carry .wh/s1: speed-start's pipeline with the
#                                              site /tmp/site523 (its fixtures build on the
#                                              training site; the benchmark waits for
#                                              one-install); SPEED_BACKENDS="triton
#                                              flashinfer" adds each backend's plugin/stock
#                                              pair after it (result/backends.tgz);
#                                              BENCH_PIN_CPUS=auto pins every server's
#                                              parts alike (bench_speed --pin-cpus; the
#                                              seed-shape bench reads it too)
#   bash node/gpu_node.sh ferry-recv           carry .ferry/BUNDLE/part-KK + manifest.json
#   bash node/gpu_node.sh one-install BUNDLE [LEFT_S]
#                                              then speed-wait [SECS] as above (LEFT_S: the
#                                              device seconds left; the suite's soak fits it)
#   bash node/gpu_node.sh speed-rebench [bench args]
#                                              the bench again on the fixtures already in
#                                              /tmp/speed: stops the running pipeline (its
#                                              bench writes what it has), keeps its result
#                                              as result-N, starts the benches detached;
#                                              then speed-wait
#   bash node/gpu_node.sh speed-rebench-pipeline
#                                              speed-rebench's (from /tmp/repo)
#
# The seed's shape (one TP8 rank of Kimi-K2.5, trained MLA + MoE widened to hidden 7168) on
# SGLang 0.5.23, one nvidia-h200:
#   bash node/gpu_node.sh seed-shape-start [bench args]
#                                              carry .wh/s1: make_mla_fixtures all + widen
#                                              (deepen + widen with a carried seed-pack
#                                              bundle), then (after one-install) bench_speed
#                                              on the wide pair, detached
#   bash node/gpu_node.sh ferry-recv; one-install BUNDLE   as for one-start
#   bash node/gpu_node.sh moe-placement-start  carry .wh/s1, the bundle ferried first: deepen
#                                              + widen, then (after one-install) the MoE config
#                                              tuned on this GPU and moe_placement on it, no
#                                              server, detached
#   bash node/gpu_node.sh moe-placement-wait [SECS]
#                                              watch; its results and logs -> $OUT
#   bash node/gpu_node.sh moe-mode [--run ...]  after `stage s1` and one-install: no bundle,
#                                              no server: moe_mode on a committed
#                                              tune-moe.json's config (fresh compile vs warm
#                                              cache, PDL on vs off), in the calling call
#   bash node/gpu_node.sh seed-shape-wait [SECS]
#                                              watch; fixture manifest + results -> $OUT, and
#                                              the fresh fixtures' bundle parts while the
#                                              bench runs: here `python node/ferry.py collect
#                                              mla-fixtures.tar --from /work/.device --out
#                                              .ferry` gathers them (speed-fixtures.tar alike)
#   bash node/gpu_node.sh seed-shape-bench [args]
#                                              a fused-MoE config tuned for the target
#                                              (tune_moe; SEED_MOE_TUNE=0: SGLang's default;
#                                              SEED_MOE_CONFIG_FROM=REPORT: an earlier run's
#                                              tuned config exactly, nothing timed;
#                                              beside it moe-configs-bn64, moe_config_alias),
#                                              bench_speed on the wide pair -> $OUT (chain
#                                              3/1/4, 5/1/6, the seed's tree 3/4/5, and
#                                              plugin vs stock on the converted drafter;
#                                              batch 1; fa3 unless args say), the same with
#                                              dummy weights (the cycle costs), and
#                                              sglang-ext tune (with the target's config)
#                                              checked against the first;
#                                              SEED_MOE_PLACEMENT=1 then times the fused MoE
#                                              by weight placement (moe_placement)
#   bash node/gpu_node.sh seed-pack [FIRST]    the trained small MLA target and drafter ->
#                                              $OUT, three 16 MB parts a call (FIRST 0, 3,
#                                              ...); here they go to .ferry/mla-fixtures.tar/,
#                                              and ferry-recv before the next seed-shape-start
#                                              carries them: that run only deepens and widens
#                                              them (fixtures.cache, kind mla)
#   bash node/gpu_node.sh seed-unpack          that step of seed-shape-pipeline: the carried
#                                              bundle into /tmp/mla, deepened and widened
#
# Where a verify cycle's time goes (stock SGLang, dummy 8B-shaped weights, tau ~ 1):
#   bash node/gpu_node.sh dummy-profile-start  carry .wh/s1: start the profile detached; then
#                                              stage s2 ...; stage sN && install
#   bash node/gpu_node.sh dummy-profile-wait [SECS]
#                                              watch; results, traces, server logs -> $OUT
#   bash node/gpu_node.sh dummy-bench-start [bench args]
#                                              bench_speed on the dummy 8B shape with the plugin
#                                              loaded (tau ~ 1: a cycle's cost is 1 / speedup),
#                                              detached; after one-install (no training).
#                                              DUMMY_SHAPE=rank: #24's rank shape instead;
#                                              DUMMY_MOE_CONFIG_FROM=REPORT: a committed
#                                              tune-moe.json's fused-MoE config for all
#   bash node/gpu_node.sh dummy-prepare DIR    what dummy-bench-pipeline writes first (the
#                                              dummy models; the MoE config it serves)
#   bash node/gpu_node.sh dummy-bench-wait [SECS]
#                                              watch; speed.json, bench log, server logs and
#                                              the slimmed profiles -> $OUT
#   bash node/gpu_node.sh slim-profiles LOGS TGZ
#                                              each LOGS/profiles/SERVER trace, its kernels
#                                              and graph launches only (moe_overlap
#                                              --slim-only), tarred into TGZ
#
# The whole GPU suite with the seed case, chunks from the training-first split:
#   bash node/gpu_node.sh suite-start [pytest args]
#                                              stage s1, install the training subset, start
#                                              make_fixtures (bf16 reference) || make_mla_fixtures,
#                                              then (after `install`) the patched copy and
#                                              pytest -m gpu, detached
#   bash node/gpu_node.sh stage s2 ...; stage sN && bash node/gpu_node.sh install
#   bash node/gpu_node.sh suite-wait [SECS]    watch; results + fixture manifests -> $OUT
#
# Files larger than a call (the unstripped sglang-kernel with FA3 + FlashMLA, torch 2.14.1):
#   python node/ferry.py split FILE            here; then one call per part, back to back:
#   bash node/gpu_node.sh ferry-recv           carry .ferry/FILE/part-KK + .ferry/FILE/manifest.json
#   bash node/gpu_node.sh ferry-join LOCK      every complete file into /tmp/wh, checked against
#                                              LOCK (sha256 or upstream-sha256); a stripped copy
#                                              of the same name is set aside, then `install`
#
# SGLang 0.5.23 (GPU 0) and 0.5.17 (GPU 1) side by side on nvidia-h200-x2:
#   bash node/gpu_node.sh dual-start           carry .wh/s1: training subset, fixtures start
#                                              (both fixture builders + the window drafter)
#   bash node/gpu_node.sh ferry-recv           carry .ferry/BUNDLE/part-KK + manifest.json,
#                                              one call per part (BUNDLE: see README)
#   bash node/gpu_node.sh dual-install BUNDLE  join + check the bundle, install 0.5.17 into
#                                              /tmp/site and 0.5.23 into /tmp/site523
#   bash node/gpu_node.sh smoke SITE GPU       optional: one plugin server on SITE, one request
#   bash node/gpu_node.sh dual-go              release both suites with the newest checkout
#   bash node/gpu_node.sh dual-wait [SECS]     watch; both suites' results -> $OUT/sglangV/
#
# SGLang 0.5.23 alone on one nvidia-h200 (the suite, the patched copy, the seed case):
#   bash node/gpu_node.sh one-start            carry .wh/s1 (training subset): the fixtures
#                                              start (both builders, one GPU)
#   bash node/gpu_node.sh ferry-recv           carry .ferry/BUNDLE/part-KK + manifest.json,
#                                              one call per part, back to back
#   bash node/gpu_node.sh one-install BUNDLE   join + check + install 0.5.23 into /tmp/site523;
#                                              the suite starts once the fixtures are done
#   bash node/gpu_node.sh one-wait [SECS]      watch; results + logs -> $OUT
#
# Steps the ones above run (detached pipelines and their parts; callable by hand):
#   bash node/gpu_node.sh suite-pipeline       suite-start's pipeline (from /tmp/repo)
#   bash node/gpu_node.sh speed-pipeline       speed-start's pipeline (from /tmp/repo)
#   bash node/gpu_node.sh dummy-profile        dummy-profile-start's pipeline (from /tmp/repo)
#   bash node/gpu_node.sh dummy-bench-pipeline dummy-bench-start's pipeline (from /tmp/repo)
#   bash node/gpu_node.sh dual-pipeline        dual-start's pipeline (from /tmp/repo)
#   bash node/gpu_node.sh one-pipeline         one-start's pipeline (from /tmp/repo)
#   bash node/gpu_node.sh seed-shape-pipeline  seed-shape-start's pipeline (from /tmp/repo)
#   bash node/gpu_node.sh moe-placement-pipeline
#                                              moe-placement-start's pipeline (from /tmp/repo)
#   bash node/gpu_node.sh suite-on VERSION SITE GPU PORT_BASE
#                                              the patched copy of that SGLang, then its suite
#   bash node/gpu_node.sh public-on SITE PORT_BASE
#                                              the published-drafter corpus alone (dummy targets)
#   bash node/gpu_node.sh install-site WHEEL...
#                                              wheels + this project into $SGLANG_EXT_SITE
#   bash node/gpu_node.sh install-523          0.5.23's site in /tmp/site523 (from /tmp/wh523)
#   bash node/gpu_node.sh site-check           versions and plugins importable from $SGLANG_EXT_SITE
#   bash node/gpu_node.sh pyrun CMD...         CMD with $SGLANG_EXT_SITE's PYTHONPATH
#
# Wheel chunks come from: python node/wheelhouse.py build --profile h200-cu130-py312 --out .wh
set -euo pipefail
WH=${SGLANG_EXT_WH:-/tmp/wh} SITE=${SGLANG_EXT_SITE:-/tmp/site} FIX=/tmp/fixtures MLA=${SGLANG_EXT_MLA_DIR:-/tmp/mla} SUITE=/tmp/suite
LOGS=${SGLANG_EXT_LOG_DIR:-/tmp/sglang-ext-logs} PATCHED=${SGLANG_EXT_PATCHED_DIR:-/tmp/site_patched}
SPEED=${SGLANG_EXT_SPEED_DIR:-/tmp/speed} TRAIN_SITE=/tmp/site-train INSTALLED=/tmp/sglang-installed
SEED=${SGLANG_EXT_SEED_DIR:-/tmp/seed}
PACKS=${SGLANG_EXT_PACK_DIR:-/tmp}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# nvidia-cutlass-dsl (SGLang 0.5.23's LlamaMLP DualGemm imports `cutlass` on Hopper) puts its
# packages on sys.path with a .pth file, which a --target site on PYTHONPATH never runs. The
# entry goes in whether or not the site exists yet: a detached pipeline reads this line when it
# starts, before one-install fills the site, and on 2026-12-07 (twenty-second session) a
# dummy-bench pipeline that checked for the folder then served every llama drafter without it
# (ModuleNotFoundError: cutlass, at DualGemm). A folder that never comes costs nothing.
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}:$SITE/nvidia_cutlass_dsl/dsl_packages"
export PYTHONUNBUFFERED=1

# The dummy models in DIR and DIR/result: DUMMY_SHAPE=rank writes issue #24's rank shape
# (fixtures.make_dummy_rank) in place of the 8B one; DUMMY_MOE_CONFIG_FROM=REPORT serves every
# server that committed tune-moe.json's fused-MoE config (tune_moe --from-report, as
# SEED_MOE_CONFIG_FROM), so a one-token launch is the trained servers' exactly (exported here:
# call it in the shell that starts the bench)
dummy_prepare() {
    local dir=$1
    case ${DUMMY_SHAPE:-8b} in
    8b) python3 -m sglang_ext_tools.fixtures.make_dummy_8b "$dir" || return 1 ;;
    rank) python3 -m sglang_ext_tools.fixtures.make_dummy_rank "$dir" || return 1 ;;
    *) echo "DUMMY_SHAPE=${DUMMY_SHAPE}: expected 8b or rank" >&2; return 2 ;;
    esac
    mkdir -p "$dir/result"
    if [ -n "${DUMMY_MOE_CONFIG_FROM:-}" ]; then
        moe_config_from_report DUMMY_MOE_CONFIG_FROM "$DUMMY_MOE_CONFIG_FROM" \
            "$dir/moe-configs" "$dir/result" || return 1
    fi
}
# SGLANG_MOE_CONFIG_DIR=DIR with the fused-MoE config a committed tune report picked
# (tune_moe --from-report; nothing timed; RESULT gets tune-moe.json and its log), or status 1
# with a line naming VAR, the report and the log (on stderr, and in ALSO when given): a run
# that asked for that config starts no server on SGLang's default one, whose kernels are not
# the ones it compares with (no silent fallback)
moe_config_from_report() {
    local var=$1 report=$2 dir=$3 result=$4 also=${5:-/dev/null}
    rm -rf "$dir" "$result/tune-moe.json"
    if ! python3 -m sglang_ext_tools.tune_moe --from-report "$report" --out "$dir" \
        --json "$result/tune-moe.json" >"$result/tune-moe.log" 2>&1; then
        echo "$var=$report: no config rebuilt ($result/tune-moe.log); no server started" \
            | tee -a "$also" >&2
        return 1
    fi
    export SGLANG_MOE_CONFIG_DIR=$dir
}
# The detached pipelines run from their own copy: each device call re-syncs the checkout.
copy_repo() {
    rm -rf /tmp/repo && mkdir /tmp/repo && cp -r scripts node sglang_ext sglang_ext_tools tests patches pyproject.toml /tmp/repo/
}
# Stage the training subset, copy the checkout and start `gpu_node.sh PIPELINE` from the copy
# in a new session (it outlives this call), its log in DIR/pipeline.log; the remaining
# arguments reach it through the variable VAR.
start_detached() {
    train_site
    launch_detached "$@"
}
# start_detached without the training site (speed-rebench: the fixtures exist). The pipeline
# is its session's leader, its id in DIR/pipeline.pid (stop_session).
launch_detached() {
    local pipeline=$1 dir=$2 var=$3
    shift 3
    mkdir -p "$dir"
    copy_repo
    env "$var=$*" setsid nohup bash -c 'echo $$ >"$1"; exec bash "${@:2}"' _ "$dir/pipeline.pid" \
        /tmp/repo/node/gpu_node.sh "$pipeline" >"$dir/pipeline.log" 2>&1 </dev/null &
    sleep 2
    cat "$dir/pipeline.log"
}
# Stop a detached pipeline and everything of its session (PIDFILE: launch_detached's), by
# session id, never by command-line pattern (on 2026-12-03 a `pkill -f` typed by hand matched
# its own command and killed the call that sent it):
# - the pipeline itself first (TERM), so it starts nothing more;
# - each `timeout` in the session gets SIGINT, which it passes to the step it runs: a bench
#   stopped as at its limit (bench_speed writes what it measured and stops its servers;
#   speed-bench packs their logs);
# - up to WAIT_S seconds for those to end, then TERM, then KILL, for whatever is left (the
#   fixture trainers, a hung bench).
stop_session() {
    local pidfile=$1 wait_s=${2:-90} sid
    [ -f "$pidfile" ] || return 0
    sid=$(cat "$pidfile")
    rm -f "$pidfile"
    # an ended pipeline's id may belong to another process by now: only a session's leader
    if [ "$(ps -o sid= -p "$sid" 2>/dev/null | tr -d ' ')" != "$sid" ]; then return 0; fi
    kill -TERM "$sid" 2>/dev/null || true
    for pid in $(pgrep -s "$sid" -x timeout || true); do kill -INT "$pid" 2>/dev/null || true; done
    for _ in $(seq "$wait_s"); do
        pgrep -s "$sid" -x timeout >/dev/null || break
        sleep 1
    done
    pkill -TERM -s "$sid" 2>/dev/null || true
    for _ in $(seq 10); do
        pgrep -s "$sid" >/dev/null || break
        sleep 1
    done
    pkill -KILL -s "$sid" 2>/dev/null || true
}
# Wait up to WAIT_S seconds for the GPU to hold no process; then KILL the process group of
# each that still does (a server a stopped bench left behind: its scheduler holds the GPU, its
# launcher the port; bench_speed starts each server in its own session) and wait up to 15 s
# more for the memory to come free. A pid nvidia-smi reports that this machine does not have
# (another PID namespace) is left alone.
gpu_idle() {
    local pgid
    command -v nvidia-smi >/dev/null || return 0
    gpu_free "${1:-60}" && return 0
    for pid in $GPU_PIDS; do
        [ -d "/proc/$pid" ] || continue
        pgid=$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ')
        kill -KILL -- "-${pgid:-$pid}" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    done
    gpu_free 15 && return 0
    echo "gpu_idle: the GPU still holds processes $GPU_PIDS" >&2
}
# Whether the GPU holds no process within SECS seconds; what it holds last in GPU_PIDS.
gpu_free() {
    for _ in $(seq "$1"); do
        GPU_PIDS=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null || true)
        [ -z "$GPU_PIDS" ] && return 0
        sleep 1
    done
    return 1
}
# The newest checkout for a detached pipeline to pick up later (never the copy it runs from).
sync_latest() {
    rm -rf /tmp/repo-next && mkdir /tmp/repo-next
    cp -r scripts node sglang_ext sglang_ext_tools tests patches pyproject.toml /tmp/repo-next/
    rm -rf /tmp/repo-latest && mv /tmp/repo-next /tmp/repo-latest
}
# make_fixtures (VARIANTS, bf16 reference) || make_mla_fixtures, on GPU FIX_GPU and MLA_GPU
# ("": every GPU), logs in $SUITE; each writes READY or FAILED into its folder when it ends
# (a suite started beside them waits for that: SGLANG_EXT_FIXTURES_WAIT_S); sets ok=1 when
# both succeed. The free-running references are recorded only (tau is judged like for like
# in the suite), so they run on a few prompts: $FIXTURE_REF_ARGS. (At 16/8/8 they took 207 s
# of the 466 s build on 2026-12-01, and the suite's llama servers wait for the build.)
train_fixtures() {
    rm -f "$FIX/READY" "$FIX/FAILED" "$MLA/READY" "$MLA/FAILED"
    # shellcheck disable=SC2086  # flags, split on purpose
    (env ${2:+CUDA_VISIBLE_DEVICES=$2} PYTHONPATH="$TRAIN_SITE" \
        python3 -m sglang_ext_tools.fixtures.make_fixtures --out "$FIX" --scale full --device cuda \
        --ref-dtype bfloat16 --overwrite \
        --variants "$1" ${FIXTURE_REF_ARGS:---ref-prompts 4 --ref-prompts-other 2 --window-ref-prompts 2} \
        >"$SUITE/fixtures.log" 2>&1 && touch "$FIX/READY") || { mkdir -p "$FIX"; touch "$FIX/FAILED"; false; } &
    local p1=$!
    (env ${3:+CUDA_VISIBLE_DEVICES=$3} PYTHONPATH="$TRAIN_SITE" \
        python3 -m sglang_ext_tools.fixtures.make_mla_fixtures --stage all --out "$MLA" \
        --device cuda >"$SUITE/mla.log" 2>&1 && touch "$MLA/READY") || { mkdir -p "$MLA"; touch "$MLA/FAILED"; false; } &
    local p2=$!
    ok=1
    wait "$p1" || ok=0
    wait "$p2" || ok=0
}
# Up to SECS seconds until the detached pipeline in DIR has written DONE or FAILED.
wait_for() {
    for _ in $(seq "$2"); do
        if [ -f "$1/DONE" ] || [ -f "$1/FAILED" ]; then break; fi
        sleep 1
    done
}
# The training subset (chunk s1) into its own site, so fixtures start before SGLang is in.
train_site() {
    mkdir -p "$WH" && cp .wh/s1/*.whl "$WH"/
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$TRAIN_SITE" \
        .wh/s1/*.whl
}

# Each profile trace under LOGS/profiles/SERVER/ as SERVER.trace.json.gz, its kernels and graph
# launches only (moe_overlap --slim-only), tarred into TGZ (dummy-bench-pipeline); and the same
# cut to the MoE kernels and what ran beside them (--around, a fifth of the size: what a
# session commits, 2026-12-07) into moe-traces.tgz beside TGZ
slim_profiles() {
    local logs=$1 tgz=$2 slimmed cut trace server
    slimmed="$(dirname "$tgz")/slim"
    cut="$(dirname "$tgz")/moe"
    mkdir -p "$slimmed" "$cut"
    for trace in "$logs"/profiles/*/*.trace.json.gz; do
        [ -f "$trace" ] || continue
        server=$(basename "$(dirname "$trace")")
        python3 -m sglang_ext_tools.moe_overlap --trace "$trace" --slim-only \
            --slim "$slimmed/$server.trace.json.gz" || true
        # cut from the slim copy: the whole trace is read once (a slim trace slims to itself)
        python3 -m sglang_ext_tools.moe_overlap --trace "$slimmed/$server.trace.json.gz" \
            --slim-only --around --slim "$cut/$server.trace.json.gz" || true
    done
    tar -czf "$tgz" -C "$slimmed" . 2>/dev/null || true
    tar -czf "$(dirname "$tgz")/moe-traces.tgz" -C "$cut" . 2>/dev/null || true
}
# make_speed_fixtures on the training site, into $SPEED (speed-pipeline, speed-unpack)
speed_fixtures() {
    PYTHONPATH="$TRAIN_SITE" python3 -m sglang_ext_tools.fixtures.make_speed_fixtures \
        --out "$SPEED" "$@"
}
# The speed benches on the fixtures in $SPEED (speed-pipeline, speed-rebench-pipeline): the
# main bench with SPEED_BENCH_ARGS, then each of SPEED_BACKENDS' plugin/stock pairs.
speed_benches() {
    # the main bench leaves the lease room for the backends' pairs after it
    # shellcheck disable=SC2206  # the backend names, split on purpose
    backends=(${SPEED_BACKENDS:-})
    limit=$(bench_limit "${SPEED_BENCH_LIMIT:-}" 560 \
        $((${#backends[@]} * ${SPEED_BACKEND_LIMIT:-240})))
    echo "bench limit ${limit} s at $(date +%T)"
    # shellcheck disable=SC2086  # bench flags, split on purpose
    OUT="$SPEED/result" PYTHONPATH="$SITE" timeout -s INT "$limit" \
        bash node/gpu_node.sh speed-bench ${SPEED_BENCH_ARGS:-} || true
    # SPEED_BACKENDS="triton flashinfer": then, per backend, the plugin/stock pair at 3/1/4
    # beside its own baseline (plugin >= 0.99x stock on every backend; `bench_speed merge`
    # joins them here), each as one tarred folder so the call's 8 files suffice
    for backend in ${SPEED_BACKENDS:-}; do
        # shellcheck disable=SC2086  # bench flags, split on purpose
        OUT="$SPEED/result/$backend" PYTHONPATH="$SITE" timeout -s INT \
            "${SPEED_BACKEND_LIMIT:-240}" bash node/gpu_node.sh speed-bench \
            ${SPEED_BACKEND_ARGS:---settings 3,1,4 --compare-setting 3,1,4 --batches 1 \
            --rounds 2 --batch1-requests 32 --max-new-tokens 128 --mem-fraction 0.95 \
            --max-total-tokens 16384 --startup-timeout 300} \
            --attention-backend "$backend" --log-dir "$LOGS/$backend" || true
    done
    if [ -n "${SPEED_BACKENDS:-}" ]; then
        # shellcheck disable=SC2086  # the backend names, split on purpose
        (cd "$SPEED/result" && tar -czf backends.tgz $SPEED_BACKENDS) || true
    fi
}
# make_mla_fixtures on the training site, into $MLA on the GPU (seed-shape-pipeline, seed-unpack)
mla_fixtures() {
    PYTHONPATH="$TRAIN_SITE" python3 -m sglang_ext_tools.fixtures.make_mla_fixtures \
        --out "$MLA" --device cuda "$@"
}
# KIND's trained small fixtures in SRC (fixtures.cache) packed and split into 16 MB ferry
# parts in $PACKS/KIND-pack/parts/NAME, once (READY when done; BUSY while it runs, so a
# second caller waits instead of packing over it). The pipelines run it in the background
# right after a fresh build, so the waits return the parts while the bench runs (ship_parts):
# on 2026-12-03 the machine was taken back mid-bench, before an end-of-run pack
prepare_bundle() {
    local kind=$1 src=$2 name=$3 pack=$PACKS/$1-pack
    for _ in $(seq 180); do [ -f "$pack.BUSY" ] || break; sleep 1; done
    if [ -f "$pack/READY" ]; then return 0; fi
    touch "$pack.BUSY"
    rm -rf "$pack" && mkdir -p "$pack/src"
    if PYTHONPATH="$TRAIN_SITE" python3 -m sglang_ext_tools.fixtures.cache pack \
        --kind "$kind" "$src" "$pack/src/$name" \
        && python3 node/ferry.py split "$pack/src/$name" --out "$pack/parts" \
            --part-bytes 16000000; then
        touch "$pack/READY"
    fi
    rm -f "$pack.BUSY"
    [ -f "$pack/READY" ]
}
# The bundle NAME of KIND's fixtures in SRC back to this machine, three parts a call from
# part FIRST, with its manifest (speed-pack, seed-pack): put them in .ferry/NAME/ here
send_bundle() {
    local kind=$1 src=$2 name=$3 first=$4 pack=$PACKS/$1-pack part k
    prepare_bundle "$kind" "$src" "$name"
    cp "$pack/parts/$name/manifest.json" "$OUT"/
    for k in $(seq "$first" $((first + 2))); do
        part=$(printf '%s/parts/%s/part-%02d' "$pack" "$name" "$k")
        if [ -f "$part" ]; then cp "$part" "$OUT"/; fi
    done
    ls "$OUT"
}
# FILE's line in $PACKS/shipped.list: its path, size and mtime
ship_key() {
    echo "$1 $(stat -c '%s %Y' "$1")"
}
# Whether an earlier call of this lease returned FILE unchanged (ship_once lists it)
shipped() {
    touch "$PACKS/shipped.list"
    grep -qxF "$(ship_key "$1")" "$PACKS/shipped.list"
}
# FILE... into $OUT unless shipped: the waits return what rarely changes once, which leaves
# their 8 files room for ship_parts; DONE (SHIP_ALL=1) resends everything
ship_once() {
    local file
    for file in "$@"; do
        [ -f "$file" ] || continue
        if [ "${SHIP_ALL:-0}" = 1 ] || ! shipped "$file"; then
            cp "$file" "$OUT"/ && ship_key "$file" >>"$PACKS/shipped.list"
        fi
    done
}
# The prepared bundle NAME's manifest and parts that no earlier call returned, into $OUT
# while it holds fewer than 8 files and this call has added at most 3 parts (48 MB): here
# `python node/ferry.py collect NAME --from /work/.device --out .ferry` gathers them
ship_parts() {
    local kind=$1 name=$2 pack=$PACKS/$1-pack part parts=0
    [ -f "$pack/READY" ] || return 0
    for part in "$pack/parts/$name"/manifest.json "$pack/parts/$name"/part-*; do
        if [ "$(find "$OUT" -maxdepth 1 -type f | wc -l)" -ge 8 ] || [ "$parts" -ge 3 ]; then
            break
        fi
        case $part in */manifest.json) ship_once "$part"; continue ;; esac
        if ! shipped "$part"; then
            ship_once "$part"
            parts=$((parts + 1))
        fi
    done
}
# The carried bundle /tmp/ferry/NAME (ferry-recv) joined in /tmp/KIND-cache and unpacked into
# DST, refused unless it is a KIND bundle (speed-unpack, seed-unpack)
recv_bundle() {
    local kind=$1 name=$2 dst=$3
    python3 node/ferry.py status "/tmp/ferry/$name/manifest.json"
    python3 node/ferry.py join "/tmp/ferry/$name/manifest.json" --out "/tmp/$kind-cache"
    PYTHONPATH="$TRAIN_SITE" python3 -m sglang_ext_tools.fixtures.cache unpack \
        --kind "$kind" "/tmp/$kind-cache/$name" "$dst"
}

# A bench's time limit: what the lease has left (one-install's DEADLINE, from its LEFT_S) less
# 90 s for the last poll and RESERVE seconds for what runs after it, capped by SET where the
# variable is set; without a deadline SET, else DEFAULT.
bench_limit() {
    local set=$1 default=$2 reserve=${3:-0} left
    if [ -f "$SUITE/DEADLINE" ]; then
        left=$(($(cat "$SUITE/DEADLINE") - $(date +%s) - 90 - reserve))
        if [ -n "$set" ] && [ "$set" -lt "$left" ]; then left=$set; fi
        echo "$left"
    else
        echo "${set:-$default}"
    fi
}
step=${1:?usage: gpu_node.sh STEP [ARGS...] (the steps: see the header of node/gpu_node.sh)}
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
        python3 node/ferry.py status "$manifest" || true
    done
    ;;
ferry-join)
    lock=${1:?usage: gpu_node.sh ferry-join LOCK}
    mkdir -p "$WH"
    for manifest in /tmp/ferry/*/manifest.json; do
        name=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["file"])' "$manifest")
        [ -f "$WH/$name" ] && mv "$WH/$name" "$WH/$name.stripped"
        python3 node/ferry.py join "$manifest" --out "$WH" --lock "$lock"
    done
    ;;
install)
    bash node/gpu_node.sh install-site "$WH"/*.whl
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
    train_fixtures llama,llama3layer,random,qwen3,sglang4layer "" ""
    while [ ! -f "$INSTALLED" ]; do sleep 2; done
    if [ "$ok" = 1 ]; then
        bash node/gpu_node.sh patched 0.5.17 >"$SUITE/patched.log" 2>&1 || true
        # shellcheck disable=SC2086  # pytest flags, split on purpose
        OUT="$SUITE/result" SGLANG_EXT_MLA_FIXTURES="$MLA" timeout -s INT "${SUITE_LIMIT:-900}" \
            bash node/gpu_node.sh test ${SUITE_PYTEST_ARGS:-} || true
        touch "$SUITE/DONE"
    else
        touch "$SUITE/FAILED"
    fi
    ;;
suite-wait)
    wait_for "$SUITE" "${1:-540}"
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
speed-one-start)
    # the pipeline's $SITE (its header reads SGLANG_EXT_SITE): what one-install fills
    SGLANG_EXT_SITE=/tmp/site523 start_detached speed-pipeline "$SPEED" SPEED_BENCH_ARGS "$@"
    ;;
speed-pipeline)
    # base -> widen-target || drafter nbr=true || drafter nbr=false -> widen-drafters, all on
    # the training site (torch, transformers, speculators: .wh/s1), so the fixtures are built
    # while the wheel set still travels (~400 s of the 0.5.23 ferry + install; the drafters
    # alone were 236 s on 2026-11-29); then (after `install`) speed-bench. Ends with DONE or
    # FAILED. Runs detached, so no idle gap between device calls can lose it: `speed-wait`
    # only watches.
    cd /tmp/repo
    ok=0
    # A bundle of an earlier session's trained small models (`speed-pack`), carried by
    # ferry-recv before speed-one-start: only the widen stages run (~80 s instead of ~420 s),
    # and the drafters are the same as that session's (fixtures.cache)
    if [ -f /tmp/ferry/speed-fixtures.tar/manifest.json ] && bash node/gpu_node.sh speed-unpack
    then
        ok=1
    elif [ -n "${SPEED_RESUME_STEPS_SCALE:-}${SPEED_FRESH_DRAFTER_ARGS:-}" ]; then
        # a run asked to continue the carried drafter, or to train a new one beside it,
        # measures nothing else in its place
        echo "fixtures: SPEED_RESUME_STEPS_SCALE or SPEED_FRESH_DRAFTER_ARGS is set but the" \
            "carried bundle did not unpack and train (above); no fresh fixtures instead"
    elif rm -f "$SPEED/cache.json" && speed_fixtures --stage base; then
        speed_fixtures --stage widen-target >"$SPEED/widen-target.log" 2>&1 &
        p0=$!
        # SPEED_DRAFTER_STEPS_SCALE=2: the drafters trained twice as long (~+184 s on the
        # H200; recipe_check drafter-steps, CPU: 3x the steps gave 1.15x the tau).
        # SPEED_DRAFTER_STEPS_SCALE_TRUE / _FALSE set one drafter's alone: one drafter
        # trained longer than the other on the same target is an A/B of the steps in one
        # run (a retrained target moves tau by up to 0.5 from one session to the next)
        all_scale=${SPEED_DRAFTER_STEPS_SCALE:-1}
        speed_fixtures --stage drafter --nbr true \
            --drafter-steps-scale "${SPEED_DRAFTER_STEPS_SCALE_TRUE:-$all_scale}" \
            >"$SPEED/drafter-true.log" 2>&1 &
        p1=$!
        speed_fixtures --stage drafter --nbr false \
            --drafter-steps-scale "${SPEED_DRAFTER_STEPS_SCALE_FALSE:-$all_scale}" \
            >"$SPEED/drafter-false.log" 2>&1 &
        p2=$!
        if wait "$p0" && wait "$p1" && wait "$p2" && speed_fixtures --stage widen-drafters; then
            ok=1
            # the fresh small models packed now, for the waits to return while the bench runs
            prepare_bundle speed "$SPEED" speed-fixtures.tar >"$SPEED/pack.log" 2>&1 &
        fi
    fi
    echo "fixtures done (ok=$ok) at $(date +%T); waiting for the install"
    while [ ! -f "$INSTALLED" ]; do sleep 2; done
    if [ "$ok" = 1 ]; then
        speed_benches
        touch "$SPEED/DONE"
    else
        touch "$SPEED/FAILED"
    fi
    ;;
speed-rebench)
    # The bench again on the fixtures in $SPEED with new arguments (SPEED_BENCH_LIMIT and the
    # backends' variables as for speed-one-start): a running pipeline is stopped
    # (stop_session), its result kept as result-N, and speed-rebench-pipeline started
    # detached; speed-wait watches it. Neither fixtures nor wheels travel again.
    if [ ! -f "$SPEED/stage-widen-drafters.json" ]; then
        echo "speed-rebench: no widened fixtures in $SPEED (stage-widen-drafters.json); start with speed-one-start" >&2
        exit 2
    fi
    if [ ! -f "$SPEED/pipeline.pid" ] && [ -f "$SPEED/pipeline.log" ] \
        && [ ! -f "$SPEED/DONE" ] && [ ! -f "$SPEED/FAILED" ]; then
        echo "speed-rebench: $SPEED has a pipeline that is not DONE and left no pipeline.pid" \
            "(started before speed-rebench existed?); stop it first" >&2
        exit 2
    fi
    stop_session "$SPEED/pipeline.pid"
    gpu_idle 60
    if [ -d "$SPEED/result" ]; then
        n=1
        while [ -e "$SPEED/result-$n" ]; do n=$((n + 1)); done
        mv "$SPEED/result" "$SPEED/result-$n"
        echo "speed-rebench: the earlier result is in $SPEED/result-$n"
    fi
    rm -f "$SPEED/DONE" "$SPEED/FAILED"
    SGLANG_EXT_SITE=/tmp/site523 launch_detached speed-rebench-pipeline "$SPEED" \
        SPEED_BENCH_ARGS "$@"
    ;;
speed-rebench-pipeline)
    # speed-rebench's: speed-pipeline's benches alone (after one-install); DONE at the end
    cd /tmp/repo
    while [ ! -f "$INSTALLED" ]; do sleep 2; done
    speed_benches
    touch "$SPEED/DONE"
    ;;
seed-shape-start)
    SGLANG_EXT_SITE=/tmp/site523 start_detached seed-shape-pipeline "$SEED" SEED_BENCH_ARGS "$@"
    ;;
seed-shape-pipeline)
    # make_mla_fixtures all -> widen -> (after one-install) seed-shape-bench; ends with DONE
    # or FAILED. Runs detached: `seed-shape-wait` only watches.
    cd /tmp/repo
    ok=0
    # A bundle of an earlier session's trained small target and drafter (`seed-pack`), carried
    # by ferry-recv before seed-shape-start: only deepen and widen run (~55 s instead of
    # ~430 s), on the same small models as that session's (fixtures.cache). Without it (or if
    # it fails: its cache.json goes, the full build rewrites the rest) the full build.
    # --no-reference: the suite's reference tau is not used here (~64 s of device time);
    # --no-wide-tau (SEED_WIDE_TAU=" " keeps it): the wide pair's reference tau, 209 s on
    # 2026-12-02 (wide 1.8369, deep 2.0 there), which the bench does not read
    : >"$SEED/mla.log"
    if [ -f /tmp/ferry/mla-fixtures.tar/manifest.json ] \
        && bash node/gpu_node.sh seed-unpack >>"$SEED/mla.log" 2>&1; then
        ok=1
    elif rm -f "$MLA/cache.json" \
        && mla_fixtures --stage all --no-reference >>"$SEED/mla.log" 2>&1 \
        && mla_fixtures --stage widen ${SEED_WIDE_TAU:---no-wide-tau} >>"$SEED/mla.log" 2>&1
    then
        ok=1
        # the fresh small models packed now, for the waits to return while the bench runs
        prepare_bundle mla "$MLA" mla-fixtures.tar >"$SEED/pack.log" 2>&1 &
    fi
    while [ ! -f "$INSTALLED" ]; do sleep 2; done
    if [ "$ok" = 1 ]; then
        limit=$(bench_limit "${SEED_BENCH_LIMIT:-}" 1000)
        echo "bench limit ${limit} s at $(date +%T)"
        # shellcheck disable=SC2086  # bench flags, split on purpose
        OUT="$SEED/result" PYTHONPATH="$SITE" timeout -s INT "$limit" \
            bash node/gpu_node.sh seed-shape-bench ${SEED_BENCH_ARGS:-} || true
        touch "$SEED/DONE"
    else
        touch "$SEED/FAILED"
    fi
    ;;
seed-shape-bench)
    # The trained wide pair (acceptance records per server for `sglang-ext tune`), then the
    # same settings with dummy weights (zero acceptance: the cycle costs the advisor reads,
    # with the target's config for the MoE fan-out dummy routing hides), then the advisor
    # checked against the measured matrix. Sized for one session: the wide target decodes
    # ~110 tok/s at batch 1 (H200, fa3, 2026-12-02), so 16 prompts x 128 tokens, 2 rounds.
    # Five ~13 GB servers starting together at 0.13 failed SGLang 0.5.23's KV-cache check,
    # which counts the others' weights loading meanwhile as this server's
    # (mem_cache/kv_cache_configurator.py:_profile_available_bytes asked for 0.30-0.34). The
    # split-expert target is ~25 GB: four servers at a time (baseline + three), each pool
    # fixed by --max-total-tokens so a high fraction passes that check without reserving
    # memory (launch.Server.max_total_tokens: the GPU suite's 19 servers start that way).
    # Worst case, all four load inside one server's window: 4 x ~25 GB of 140 asks ~0.75.
    # Plugin vs stock: the drafter converted for stock SGLang (--force: stock has no
    # norm_before_residual, so both servers of the pair run the converted math) served by
    # the plugin's class and by stock's, side by side at 3/1/4 -- the serving code's cost.
    mkdir -p "$OUT"
    # Stopped at its limit (SIGINT to the group, as speed-bench): no stage after the one it
    # cut runs but the advisor and the packing of the server logs
    stopped=
    trap 'stopped=1; echo "seed-shape-bench: stopped at its limit" >&2' INT TERM
    cp "$MLA/wide-target/config.json" "$OUT/wide-target-config.json"
    rm -rf "$MLA/wide-drafter-sglang"
    pair=()  # no pair (and the reason in convert.log) if the conversion is refused
    if python3 -m sglang_ext.cli convert "$MLA/wide-drafter" "$MLA/wide-drafter-sglang" \
        --target "$MLA/wide-target" --force >"$OUT/convert.log" 2>&1; then
        # --second-pair: a second plugin/stock pair in a group of its own, both pooled for
        # the goal (2026-12-03: three pairs of fresh servers gave 0.960 [0.941, 0.976], 1.005
        # and 1.024, and two stock servers 0.991: one pair is one draw of instance noise)
        # SEED_SECOND_PAIR=0: one pair (a run whose question is elsewhere; its group's time
        # goes to that question's servers)
        pair=(--drafter-nbr-false "$MLA/wide-drafter-sglang" --compare-setting 3,1,4
            --drafter-nbr-false-sglang "$MLA/wide-drafter-sglang")
        if [ "${SEED_SECOND_PAIR:-1}" = 1 ]; then pair+=(--second-pair); fi
    fi
    # SEED_PAIR=0: no plugin/stock pair at all (a lease cut short: the fifth run measured
    # it, pooled over two pairs, and its group's ~160 s go to the run's own question)
    if [ "${SEED_PAIR:-1}" = 0 ]; then pair=(); fi
    # --at-once 4 is sized for an H200 (four ~28 GiB servers); --at-once-fit lowers it where
    # a group does not fit (an H100 holds two: 2026-12-06, a third server failed SGLang's
    # KV-cache check and its row read only exited(-9))
    # SEED_PREFILL_GRAPH=breakable: every server with SGLang 0.5.23's own default for this
    # model, a prefill CUDA graph (the bench's default is eager: its capture costs startup
    # time). 2026-12-03: a first token took 157 ms, 18.6 ms of it GPU kernels
    wide() {
        python3 -m sglang_ext_tools.bench_speed --target "$MLA/wide-target" \
            --drafter "$MLA/wide-drafter" --prompts "$MLA/prompts.jsonl" \
            --settings 3,1,4 5,1,6 3,4,5 --attention-backend fa3 --max-new-tokens 128 \
            --batch1-requests 16 --at-once 4 --at-once-fit --mem-fraction 0.9 \
            --max-total-tokens 16384 --startup-timeout 300 \
            ${BENCH_PIN_CPUS:+--pin-cpus "$BENCH_PIN_CPUS"} \
            ${SEED_PREFILL_GRAPH:+--prefill-graph "$SEED_PREFILL_GRAPH"} "$@"
    }
    # SGLang ships no fused-MoE kernel config for this shape: every server of 2026-12-03 logged
    # "Using default MoE kernel config ... E=32,N=256,device_name=NVIDIA_H200". Tune one on
    # this GPU first (nothing else runs on it now) and serve every server with it, the
    # baseline too, as that warning asks a user to do; SEED_MOE_TUNE=0 keeps the default.
    rm -rf "$SEED/moe-configs-bn64"  # a variant never reads an earlier run's copy
    # SEED_MOE_CONFIG_FROM=REPORT (a committed tune-moe.json): no tuning; every server gets
    # the config that report's tuning picked (tune_moe --from-report), so a run's MoE
    # kernels are an earlier run's exactly (the tenth run's cheap/dear figures were its
    # config's), and the ~130 s of tuning go to the bench
    if [ -n "${SEED_MOE_CONFIG_FROM:-}" ]; then
        moe_config_from_report SEED_MOE_CONFIG_FROM "$SEED_MOE_CONFIG_FROM" \
            "$SEED/moe-configs" "$OUT" "$OUT/bench.log" || exit 1
    elif [ "${SEED_MOE_TUNE:-1}" = 1 ]; then
        rm -rf "$SEED/moe-configs"
        if python3 -m sglang_ext_tools.tune_moe --model "$MLA/wide-target" \
            --out "$SEED/moe-configs" --json "$OUT/tune-moe.json" --quick \
            --tokens 1 2 4 5 6 8 16 32 --time-limit "${SEED_MOE_TUNE_S:-150}" \
            >"$OUT/tune-moe.log" 2>&1; then
            export SGLANG_MOE_CONFIG_DIR=$SEED/moe-configs
            # the same file with block N 64 at the verify sizes, for a variant server
            # (--variant bn64@5,1,6:SGLANG_MOE_CONFIG_DIR=$SEED/moe-configs-bn64). 2026-12-03:
            # 5/1/6's cycle was 0.17 decode steps cheaper on the run whose tuner picked 64 at 6
            # tokens than on the one whose tuner picked 32, at equal tuner times; served side
            # by side in the sixth run, 64 was 1.5 % slower after the first token: the gap
            # was between sessions (moe_config_alias)
            python3 -m sglang_ext_tools.moe_config_alias --from "$SEED/moe-configs" \
                --out "$SEED/moe-configs-bn64" --set 4,5,6:BLOCK_SIZE_N=64 \
                >>"$OUT/tune-moe.log" 2>&1 || true
            # the verify sizes timed again beside the shared expert's MLP on a second stream,
            # as the server runs them (tune_moe --beside-shared): its picks and every
            # candidate's time, to hold against the bn64 variants. Reported, not served;
            # SEED_MOE_SHARED_TUNE_S=0 skips it. Into $LOGS, so server-logs.tgz carries it
            # (a DONE poll already returns 8 files, a call's most)
            if [ "${SEED_MOE_SHARED_TUNE_S:-40}" != 0 ]; then
                # $LOGS is bench_speed's to fill; it does not exist yet here (2026-12-03,
                # eighth session: the redirect failed and the report was lost)
                mkdir -p "$LOGS"
                rm -rf "$SEED/moe-configs-shared"
                python3 -m sglang_ext_tools.tune_moe --model "$MLA/wide-target" \
                    --out "$SEED/moe-configs-shared" --json "$LOGS/tune-moe-shared.json" \
                    --quick --beside-shared --tokens 4 5 6 \
                    --time-limit "${SEED_MOE_SHARED_TUNE_S:-40}" \
                    >"$LOGS/tune-moe-shared.log" 2>&1 || true
            fi
        fi
    fi
    # The zero-acceptance probe the advisor reads its cycle costs from. SEED_PROBE=twin (the
    # default): the trained target with the drafter's never-right twin (`sglang-ext
    # probe-drafter`: its final norm negated, the same cost), so the verify pass routes the
    # drafts through the target's own router and the MoE fan-out is in the cost (2026-12-03:
    # the dummy-weight probe missed 0.25-0.47 decode steps of it, and moe_fanout's byte model
    # said 0.98-1.30); SEED_PROBE=dummy: --load-format dummy, tune adds that model's fan-out.
    # SEED_PROBE_PROFILE=1: one traced batch-1 request per server splits the cycle
    # (trace_breakdown; ~120 s for four servers on 2026-12-03). Off by default since the
    # probe measures each request's first token (the request model needs no trace now), and
    # the second plugin/stock pair takes that time.
    # It runs before the trained matrix: both 2026-12-03 runs lost it to the lease's end
    # and to a machine taken back, while the matrix they did measure replicated.
    rm -rf "$MLA/wide-drafter-probe"
    probe=(--server-args "--load-format dummy")
    if [ "${SEED_PROBE:-twin}" = twin ] && python3 -m sglang_ext.cli probe-drafter \
        "$MLA/wide-drafter" "$MLA/wide-drafter-probe" 2>&1 | tee -a "$OUT/bench.log"; then
        probe=(--drafter "$MLA/wide-drafter-probe")
    fi
    # SEED_PROBE_ARGS: more bench_speed arguments for the probe (a --variant server, say:
    # "--variant bn64@3,1,4:SGLANG_MOE_CONFIG_DIR=$SEED/moe-configs-bn64"); the advisor
    # reads only the main drafter's rows
    probe_on() {
        local trace=() extra=()
        if [ "${SEED_PROBE_PROFILE:-0}" = 1 ]; then trace=(--profile); fi
        # shellcheck disable=SC2206  # bench flags, split on purpose
        extra=(${SEED_PROBE_ARGS:-})
        wide --batches 1 --rounds 2 --batch1-requests 8 "${probe[@]}" "${extra[@]}" \
            --log-dir "$LOGS/probe-$1" "${trace[@]}" --attention-backend "$1" \
            --out-json "$OUT/seed-shape-probe.json" 2>&1 | tee -a "$OUT/bench.log" || true
    }
    # SEED_PROBE=none: no zero-acceptance probe (the trained matrix's cycles, τ / speedup,
    # answer a run about one kernel config; the advisor then has no costs and says so)
    if [ "${SEED_PROBE:-twin}" != none ]; then probe_on fa3; fi
    status=130
    if [ -z "$stopped" ]; then
        set +e
        wide "${pair[@]}" --batches 1 --rounds 2 --fixtures-json "$MLA/mla-fixtures.json" \
            --acceptance-dir "$LOGS/acceptance" --log-dir "$LOGS" \
            --out-json "$OUT/seed-shape.json" --out-png "$OUT/seed-shape.png" "$@" 2>&1 \
            | tee -ia "$OUT/bench.log"
        status=${PIPESTATUS[0]}
        set -e
    fi
    backend=fa3
    if [ -z "$stopped" ] && ! python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
sys.exit(0 if any(s["status"] == "ready" for s in d["servers"]) else 1)' "$OUT/seed-shape.json"
    then
        # No server started on fa3. The wide target has DeepSeek-V3's latent (512 + 64, nope
        # and v 128: widen_mla.KIMI_K25_TP8_RANK), what SGLang serves DeepSeek with on fa3, but
        # this fixture has not been served on fa3 before; the session still measures: triton,
        # whose MLA decode takes 576 as well.
        backend=triton
        mv "$OUT/seed-shape.json" "$OUT/seed-shape-fa3-failed.json"
        rm -rf "$LOGS/acceptance"
        wide "${pair[@]}" --batches 1 --rounds 2 --fixtures-json "$MLA/mla-fixtures.json" \
            --acceptance-dir "$LOGS/acceptance" --log-dir "$LOGS/triton" \
            --out-json "$OUT/seed-shape.json" --out-png "$OUT/seed-shape.png" "$@" \
            --attention-backend triton 2>&1 | tee -a "$OUT/bench.log"
        status=${PIPESTATUS[0]}
        mv "$OUT/seed-shape-probe.json" "$OUT/seed-shape-probe-fa3-failed.json" 2>/dev/null || true
        if [ "${SEED_PROBE:-twin}" != none ]; then probe_on triton; fi
    fi
    # (spec-*: the main drafter's servers; the converted pair's records are another drafter).
    # Without a probe there are no costs to advise from: said in the log, no empty advisor.json
    if [ -f "$OUT/seed-shape-probe.json" ]; then
        python3 -m sglang_ext.cli tune "$LOGS"/acceptance/spec-*.jsonl \
            --costs "$OUT/seed-shape-probe.json" --target-config "$MLA/wide-target/config.json" \
            --against "$OUT/seed-shape.json" --json >"$OUT/advisor.json" 2>>"$OUT/bench.log" || true
    else
        echo "advisor: no zero-acceptance probe in this run (SEED_PROBE=none), no advice" \
            | tee -a "$OUT/bench.log"
    fi
    # SEED_MOE_PLACEMENT=1: with every server gone, moe_placement times SGLang's fused MoE at
    # 1, 4 and 6 tokens with the weights at other base offsets, experts and allocations, on
    # the config the servers had (issue #24, 2026-12-06: the traced requests of two servers
    # of one config differed by 1.3 ms a step in the one-token up-projection; their timed
    # rounds did not). Into $LOGS: server-logs.tgz has it
    if [ "${SEED_MOE_PLACEMENT:-0}" = 1 ]; then
        rm -f "$LOGS/moe-placement.json"
        python3 -m sglang_ext_tools.moe_placement --model "$MLA/wide-target" --tokens 1 4 6 \
            --json "$LOGS/moe-placement.json" >"$LOGS/moe-placement.log" 2>&1 || true
    fi
    # traces stay out (tens of MB; bench_speed puts their breakdown in its JSON's `profiles`)
    tar -czf "$OUT/server-logs.tgz" --exclude="*.trace.json.gz" -C "$LOGS" . 2>/dev/null
    exit "$status"
    ;;
moe-placement-start)
    SGLANG_EXT_SITE=/tmp/site523 start_detached moe-placement-pipeline "$SEED" UNUSED
    ;;
moe-placement-pipeline)
    # SGLang's fused MoE alone by where its weights sit (moe_placement), on the carried
    # bundle's rank-shape target and a config tuned on this GPU, no server: the seed-shape
    # run's last step without its bench, for a lease too short for servers (~4 min after the
    # install). Ends with DONE or FAILED; moe-placement-wait watches.
    cd /tmp/repo
    mkdir -p "$SEED/result"
    ok=0
    if bash node/gpu_node.sh seed-unpack >"$SEED/mla.log" 2>&1; then
        while [ ! -f "$INSTALLED" ]; do sleep 2; done
        # a fresh gpu_node.sh: its header puts the installed site's paths on PYTHONPATH
        if bash node/gpu_node.sh pyrun python3 -m sglang_ext_tools.tune_moe \
            --model "$MLA/wide-target" --out "$SEED/moe-configs" \
            --json "$SEED/result/tune-moe.json" --quick --tokens 1 4 6 \
            --time-limit "${SEED_MOE_TUNE_S:-60}" >"$SEED/result/tune-moe.log" 2>&1; then
            export SGLANG_MOE_CONFIG_DIR=$SEED/moe-configs
        fi
        bash node/gpu_node.sh pyrun python3 -m sglang_ext_tools.moe_placement \
            --model "$MLA/wide-target" --tokens 1 4 6 --json "$SEED/result/moe-placement.json" \
            >"$SEED/result/moe-placement.log" 2>&1 && ok=1
    fi
    if [ "$ok" = 1 ]; then touch "$SEED/DONE"; else touch "$SEED/FAILED"; fi
    ;;
moe-mode)
    # moe_mode after one-install, in this call (~40 s a process, five by default): SGLang's
    # fused MoE alone, fresh compile against warm cache and PDL on against off, on the MoE
    # config a seed-shape run's tuner wrote (its tune-moe.json, carried in the tree); no
    # fixtures, no server. Its JSON and log -> $OUT. Extra args reach moe_mode (--run ...).
    rm -rf /tmp/moe-mode
    SGLANG_EXT_SITE=/tmp/site523 bash node/gpu_node.sh pyrun python3 -m sglang_ext_tools.moe_mode \
        --tune-json "${MOE_MODE_TUNE_JSON:-tests/gpu/results/seed-shape-2026-12-06-draws-nvidia-h100-sglang0.5.23-tune-moe.json}" \
        --cache-root /tmp/moe-mode --json "$OUT/moe-mode.json" "$@" >"$OUT/moe-mode.log" 2>&1 \
        || { tail -n 40 "$OUT/moe-mode.log"; exit 1; }
    tail -n 12 "$OUT/moe-mode.log"
    ;;
moe-placement-wait)
    wait_for "$SEED" "${1:-300}"
    tail -n 5 "$SEED/mla.log" "$SEED/result/moe-placement.log" 2>/dev/null || true
    cp "$SEED"/result/*.json "$SEED"/result/*.log "$SEED/mla.log" "$MLA/mla-fixtures.json" \
        "$OUT"/ 2>/dev/null || true
    ls "$OUT"
    [ -f "$SEED/DONE" ]
    ;;
seed-shape-wait)
    wait_for "$SEED" "${1:-540}"
    grep -h "make_fixtures\|Error\|error\|done in" "$SEED/mla.log" 2>/dev/null | tail -n 12
    tail -n 25 "$SEED/result/bench.log" 2>/dev/null
    if [ -f "$SEED/DONE" ]; then export SHIP_ALL=1; fi
    # at most 8 files come back from a call. bench_speed rewrites its JSON after every
    # measurement, so each poll returns what has finished (a machine lost mid-bench keeps it);
    # the acceptance records (what `sglang-ext tune` reads) likewise, until server-logs.tgz,
    # which holds them, exists. The PNG stays behind: `bench_speed`'s write_png redraws it.
    # What is written once comes back once (ship_once; all of it again at DONE), and the
    # room left carries the fixture bundle's parts (ship_parts; the pipeline prepared them)
    cp "$SEED"/result/seed-shape.json "$SEED"/result/seed-shape-probe.json \
        "$SEED"/result/advisor.json "$OUT"/ 2>/dev/null || true
    if [ -f "$SEED/result/server-logs.tgz" ]; then
        cp "$SEED/result/server-logs.tgz" "$OUT"/
    elif [ -d "$LOGS/acceptance" ]; then
        tar -czf "$OUT/acceptance.tgz" -C "$LOGS" acceptance 2>/dev/null || true
    fi
    ship_once "$MLA/mla-fixtures.json" "$SEED"/result/wide-target-config.json \
        "$SEED"/result/convert.log "$SEED"/result/tune-moe.json
    ship_parts mla mla-fixtures.tar
    ls "$OUT"
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
    [ -f "$SEED/DONE" ]
    ;;
dummy-profile-start)
    # Stock SGLang, dummy 8B-shaped weights, tau ~ 1: where a verify cycle's time goes.
    mkdir -p "$WH" && cp .wh/s1/*.whl "$WH"/
    copy_repo
    setsid nohup bash /tmp/repo/node/gpu_node.sh dummy-profile >/tmp/dummy.log 2>&1 \
        </dev/null &
    ;;
dummy-profile)
    cd /tmp/repo
    while [ ! -f "$INSTALLED" ]; do sleep 2; done
    python3 -m sglang_ext_tools.fixtures.make_dummy_8b /tmp/dummy
    SGLANG_PLUGINS=__no_plugin__ timeout -s INT 400 python3 -m sglang_ext_tools.bench_speed \
        --target /tmp/dummy/target --drafter /tmp/dummy/drafter \
        --prompts /tmp/dummy/prompts.jsonl --settings 5,1,6 --batches 1 --rounds 1 \
        --max-new-tokens 128 --mem-fraction 0.95 --max-total-tokens 8192 \
        --server-args "--load-format dummy" --startup-timeout 200 --profile \
        --log-dir /tmp/dummy/logs --profile-dir /tmp/dummy/profiles \
        --out-json /tmp/dummy/speed-dummy.json || true
    touch /tmp/dummy/DONE
    ;;
dummy-bench-start)
    # bench_speed on the dummy 8B shape (make_dummy_8b: config-only target and SGLang-format
    # 32,000-vocab drafter, --load-format dummy, tau ~ 1), the plugin loaded (its own drafter
    # class, so plugin-only switches such as SGLANG_EXT_DRAFT_FP8_LM_HEAD act): a cycle's
    # cost read straight off the speedup (1 / speedup at tau 1), no fixture to train. Starts
    # detached after one-install; dummy-bench-wait watches. Args: bench_speed's settings;
    # DUMMY_SERVER_ARGS: every server's flags (--load-format dummy and what else they share)
    # install-523 takes speculators and its extras from the training subset: staged here from
    # the .wh/s1 this call carries (no training site: nothing trains)
    bash node/gpu_node.sh stage s1
    SGLANG_EXT_SITE=/tmp/site523 launch_detached dummy-bench-pipeline /tmp/dummyb \
        DUMMY_BENCH_ARGS "$@"
    ;;
dummy-bench-pipeline)
    cd /tmp/repo
    while [ ! -f "$INSTALLED" ]; do sleep 2; done
    if ! dummy_prepare /tmp/dummyb; then touch /tmp/dummyb/DONE; exit 2; fi
    limit=$(bench_limit "${DUMMY_BENCH_LIMIT:-}" 500)
    echo "bench limit ${limit} s at $(date +%T)"
    # shellcheck disable=SC2086  # bench flags, split on purpose
    timeout -s INT "$limit" python3 -m sglang_ext_tools.bench_speed \
        --target /tmp/dummyb/target --drafter /tmp/dummyb/drafter \
        --prompts /tmp/dummyb/prompts.jsonl --server-args "${DUMMY_SERVER_ARGS:---load-format dummy}" \
        --log-dir /tmp/dummyb/logs --out-json /tmp/dummyb/result/speed.json \
        ${BENCH_PIN_CPUS:+--pin-cpus "$BENCH_PIN_CPUS"} ${DUMMY_BENCH_ARGS:-} \
        2>&1 | tee -i /tmp/dummyb/result/bench.log || true
    # every profile as its kernels and graph launches only (moe_overlap --slim-only): three
    # rank-shape traces whole would pass the 16 MiB a returned file may hold; then the logs,
    # without them
    slim_profiles /tmp/dummyb/logs /tmp/dummyb/result/slim-traces.tgz
    tar -czf /tmp/dummyb/result/server-logs.tgz -C /tmp/dummyb/logs --exclude=./profiles . \
        2>/dev/null || true
    touch /tmp/dummyb/DONE
    ;;
slim-profiles)
    # slim_profiles by hand: LOGS (a bench's --log-dir) and the TGZ to write
    slim_profiles "${1:?usage: gpu_node.sh slim-profiles LOGS TGZ}" "${2:?usage: gpu_node.sh slim-profiles LOGS TGZ}"
    ;;
dummy-prepare)
    # dummy_prepare on its own (DIR), then the MoE config dir the servers would get
    dummy_prepare "$1"
    echo "SGLANG_MOE_CONFIG_DIR=${SGLANG_MOE_CONFIG_DIR:-}"
    ;;
dummy-bench-wait)
    wait_for /tmp/dummyb "${1:-540}"
    tail -n 25 /tmp/dummyb/result/bench.log 2>/dev/null
    cp /tmp/dummyb/result/speed.json /tmp/dummyb/result/bench.log \
        /tmp/dummyb/result/server-logs.tgz /tmp/dummyb/result/slim-traces.tgz \
        /tmp/dummyb/result/moe-traces.tgz /tmp/dummyb/pipeline.log /tmp/dummyb/result/tune-moe.json "$OUT"/ 2>/dev/null || true
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
    [ -f /tmp/dummyb/DONE ]
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
    wait_for "$SPEED" "${1:-540}"
    tail -n 3 "$SPEED"/*.log 2>/dev/null | grep -v Warning
    tail -n 25 "$SPEED/result/bench.log" 2>/dev/null
    if [ -f "$SPEED/DONE" ]; then export SHIP_ALL=1; fi
    # at most 8 files come back from a call: speed-fixtures.json already merges the
    # stage-*.json and comes back once (ship_once; at DONE again, with the PNG); the room left
    # carries the fixture bundle's parts (ship_parts; the pipeline prepared them)
    cp "$SPEED"/result/speed.json "$SPEED"/result/bench.log "$SPEED"/result/server-logs.tgz \
        "$SPEED"/result/backends.tgz "$SPEED"/pipeline.log "$OUT"/ 2>/dev/null || true
    if [ -f "$SPEED/DONE" ]; then cp "$SPEED"/result/speed.png "$OUT"/ 2>/dev/null || true; fi
    ship_once "$SPEED"/speed-fixtures.json
    ship_parts speed speed-fixtures.tar
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
    [ -f "$SPEED/DONE" ]
    ;;
speed-pack)
    # The trained small speed fixtures back to this machine for the next session, three
    # 16 MB parts a call (FIRST: the first part's number; 0, 3, 6, ...): put them in
    # .ferry/speed-fixtures.tar/ here, then ferry-recv them before speed-one-start
    send_bundle speed "$SPEED" speed-fixtures.tar "${1:-0}"
    ;;
speed-unpack)
    # The carried bundle (/tmp/ferry/speed-fixtures.tar, see speed-pack) into $SPEED, then
    # the widen stages on it; speed-pipeline runs it when the bundle is there.
    if [ -n "${SPEED_RESUME_STEPS_SCALE:-}" ] && [ -n "${SPEED_FRESH_DRAFTER_ARGS:-}" ]; then
        echo "speed-unpack: SPEED_RESUME_STEPS_SCALE and SPEED_FRESH_DRAFTER_ARGS both set;" \
            "a run either continues the carried nbr=true drafter or trains a new one" >&2
        exit 2
    fi
    recv_bundle speed speed-fixtures.tar "$SPEED"
    scale_args=(${SPEED_SCALE:+--scale "$SPEED_SCALE"})
    # The nbr=true drafter trained anew on the carried target, one of two ways:
    # SPEED_FRESH_DRAFTER_ARGS="--drafter-mlp-scale 4 --drafter-steps-scale 3": a new one with
    # those make_speed_fixtures flags, the carried one kept beside it
    # (small-drafter-nbr-true-stepsN), so the bench's nbr=false pair is the in-run baseline
    # and `served_tau_ab --bench-b` reads it against the carried drafter's earlier run;
    # SPEED_RESUME_STEPS_SCALE=N: the carried one continued for N x the recipe's steps
    # (SPEED_RESUME_LR_SCALE: restart at that times the recipe's peak rate, default 1). Either
    # way its text is made again from the carried target first (drafter-data), the drafter is
    # compared on the same target with the carried nbr=false one and with earlier sessions'
    # figures of that target, and the new small models are packed for the next session
    drafter_args=()
    if [ -n "${SPEED_FRESH_DRAFTER_ARGS:-}" ]; then
        echo "fixtures: a new nbr=true drafter ($SPEED_FRESH_DRAFTER_ARGS) on the carried target"
        # shellcheck disable=SC2206  # the flags, split on purpose
        drafter_args=($SPEED_FRESH_DRAFTER_ARGS)
    elif [ -n "${SPEED_RESUME_STEPS_SCALE:-}" ]; then
        echo "fixtures: the carried drafter nbr=true trained on for ${SPEED_RESUME_STEPS_SCALE}x the recipe's steps"
        drafter_args=(--resume --drafter-steps-scale "$SPEED_RESUME_STEPS_SCALE"
            --drafter-lr-scale "${SPEED_RESUME_LR_SCALE:-1}")
    fi
    if [ ${#drafter_args[@]} -gt 0 ]; then
        speed_fixtures --stage drafter-data "${scale_args[@]}"
        speed_fixtures --stage widen-target "${scale_args[@]}" >"$SPEED/widen-target.log" 2>&1 &
        p0=$!
        speed_fixtures --stage drafter --nbr true "${scale_args[@]}" "${drafter_args[@]}" \
            >"$SPEED/drafter-true.log" 2>&1
        wait "$p0"
        speed_fixtures --stage widen-drafters "${scale_args[@]}"
        prepare_bundle speed "$SPEED" speed-fixtures.tar >"$SPEED/pack.log" 2>&1 &
    else
        echo "fixtures: the carried bundle's trained small models, widened again"
        for stage in widen-target widen-drafters; do
            speed_fixtures --stage "$stage" "${scale_args[@]}"
        done
    fi
    ;;
seed-pack)
    # The trained small MLA target and drafter back to this machine for the next session,
    # three 16 MB parts a call (FIRST: the first part's number; 0, 3, 6, ...): put them in
    # .ferry/mla-fixtures.tar/ here, then ferry-recv them before seed-shape-start
    send_bundle mla "$MLA" mla-fixtures.tar "${1:-0}"
    ;;
seed-unpack)
    # The carried bundle (/tmp/ferry/mla-fixtures.tar, see seed-pack) into $MLA, then deepen
    # and widen on it (as seed-shape-pipeline runs them: widen --no-wide-tau unless
    # SEED_WIDE_TAU says); seed-shape-pipeline runs it when the bundle is there
    recv_bundle mla mla-fixtures.tar "$MLA"
    echo "fixtures: the carried bundle's trained small models, deepened and widened again"
    mla_fixtures --stage deepen
    # shellcheck disable=SC2086  # the flag, split on purpose (SEED_WIDE_TAU=" ": none)
    mla_fixtures --stage widen ${SEED_WIDE_TAU:---no-wide-tau}
    ;;
speed-bench)
    mkdir -p "$OUT"
    # The pipeline stops a bench at its limit with SIGINT (timeout -s INT, to the whole
    # group): bench_speed writes what it measured, and this step must live on to pack the
    # server logs (2026-12-03: a cut bench left none; tee -i keeps the log's tail)
    trap 'echo "speed-bench: stopped at its limit; packing the server logs" >&2' INT TERM
    set +e
    python3 -m sglang_ext_tools.bench_speed --target "$SPEED/target-8b" \
        --drafter "$SPEED/drafter-8b-nbr-true" \
        --drafter-nbr-false "$SPEED/drafter-8b-nbr-false" \
        --drafter-nbr-false-sglang "$SPEED/drafter-8b-nbr-false-sglang" \
        --prompts "$SPEED/prompts.jsonl" --fixtures-json "$SPEED/speed-fixtures.json" \
        --log-dir "$LOGS" --out-json "$OUT/speed.json" --out-png "$OUT/speed.png" \
        ${BENCH_PIN_CPUS:+--pin-cpus "$BENCH_PIN_CPUS"} "$@" 2>&1 | tee -i "$OUT/bench.log"
    status=${PIPESTATUS[0]}
    set -e
    # traces stay out (tens of MB; bench_speed puts their breakdown in its JSON's `profiles`)
    tar -czf "$OUT/server-logs.tgz" --exclude="*.trace.json.gz" -C "$LOGS" . 2>/dev/null
    exit "$status"
    ;;
fixtures)
    python3 -m sglang_ext_tools.fixtures.make_fixtures --out "$FIX" --scale full --device cuda "$@" \
        2>&1 | tee "$OUT/fixtures.log"
    cp "$FIX/fixtures.json" "$OUT/"
    ;;
patched)
    version=${1:?sglang version of the series}
    rm -rf "$PATCHED" && mkdir -p "$PATCHED"
    cp -r "$SITE/sglang" "$PATCHED"/
    python3 scripts/apply_patches.py apply --sglang-site "$PATCHED" --series "patches/v$version"
    ;;
test)
    if [ -d "$PATCHED/sglang" ]; then export SGLANG_EXT_PATCHED_SITE=$PATCHED; fi
    set +e
    SGLANG_EXT_FIXTURES="$FIX" SGLANG_EXT_RESULTS_DIR="$OUT" SGLANG_EXT_LOG_DIR="$LOGS" \
        python3 -m pytest -m gpu ${SUITE_PATHS:-tests/gpu} -q -rA -p no:cacheprovider "$@" 2>&1 \
        | tee "$OUT/pytest.log"
    status=${PIPESTATUS[0]}
    tar -czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null
    exit "$status"
    ;;
dual-start)
    mkdir -p "$SUITE"
    sync_latest
    start_detached dual-pipeline "$SUITE" SUITE_PYTEST_ARGS "$@"
    python3 -m pip list --format=freeze >"$OUT/node-pip-freeze.txt" 2>/dev/null || true
    ;;
dual-pipeline)
    # fixtures (GPU 0) || MLA fixtures (GPU 1) -> (after dual-install) the suite on SGLang
    # 0.5.23 (GPU 0) || the suite on 0.5.17 (GPU 1); ends with DONE or FAILED.
    cd /tmp/repo
    train_fixtures "${FIXTURE_VARIANTS:-llama,llama3layer,random,qwen3,sglang4layer,window}" 0 1
    touch "$SUITE/FIXTURES-$ok"
    # `dual-go` (after dual-install) releases the suites with the newest checkout it synced.
    while [ ! -f "$SUITE/GO" ]; do sleep 2; done
    if [ "$ok" = 1 ]; then
        rm -rf /tmp/repo-suite && cp -r /tmp/repo-latest /tmp/repo-suite && cd /tmp/repo-suite
        gpus=$(nvidia-smi -L | wc -l)
        bash node/gpu_node.sh suite-on 0.5.23 /tmp/site523 0 32000 &
        s1=$!
        bash node/gpu_node.sh suite-on 0.5.17 /tmp/site $((gpus > 1 ? 1 : 0)) 31000 &
        s2=$!
        wait "$s1" || true
        wait "$s2" || true
        touch "$SUITE/DONE"
    else
        touch "$SUITE/FAILED"
    fi
    ;;
suite-on)
    # VERSION SITE GPU PORT_BASE: the patched copy of that SGLang, then its GPU suite
    version=$1 res="$SUITE/sglang$1"
    mkdir -p "$res"
    export SGLANG_EXT_SITE=$2 SGLANG_EXT_PATCHED_DIR=/tmp/site_patched-$1
    export SGLANG_EXT_LOG_DIR=/tmp/sglang-ext-logs-$1 PYTHONPATH=$2
    bash node/gpu_node.sh patched "$version" >"$res/patched.log" 2>&1 || true
    limit=${SUITE_LIMIT:-900}
    if [ -n "${SGLANG_EXT_SUITE_DEADLINE:-}" ]; then
        # pytest stops 45 s before the device time does (the soak ends 75 s before it)
        limit=$((SGLANG_EXT_SUITE_DEADLINE - $(date +%s) - 45))
        if [ "$limit" -lt 60 ]; then limit=60; fi
    fi
    # shellcheck disable=SC2086  # pytest flags, split on purpose
    CUDA_VISIBLE_DEVICES=$3 SGLANG_EXT_PORT_BASE=$4 OUT="$res" SGLANG_EXT_MLA_FIXTURES="$MLA" \
        timeout -s INT "$limit" bash node/gpu_node.sh test ${SUITE_PYTEST_ARGS:-}
    ;;
one-start)
    mkdir -p "$SUITE"
    sync_latest
    start_detached one-pipeline "$SUITE" SUITE_PYTEST_ARGS "$@"
    ;;
one-pipeline)
    # fixtures || MLA fixtures (one GPU), and from one-install on, one pytest process of the
    # 0.5.23 suite with the newest checkout synced by one-install: the public-config corpus
    # first (no fixture needed), then the llama servers once their fixtures are READY, the
    # MLA servers in the background once theirs are (tests/gpu/suite.py); ends with DONE.
    cd /tmp/repo
    train_fixtures "${FIXTURE_VARIANTS:-llama,llama3layer,random,qwen3,sglang4layer,window}" "" "" &
    while [ ! -f "$INSTALLED" ]; do sleep 2; done
    if [ -f "$SUITE/DEADLINE" ]; then
        SGLANG_EXT_SUITE_DEADLINE=$(cat "$SUITE/DEADLINE")
        export SGLANG_EXT_SUITE_DEADLINE  # suite-on's limit, the soak's length
    fi
    rm -rf /tmp/repo-suite && cp -r /tmp/repo-latest /tmp/repo-suite && cd /tmp/repo-suite
    # 2026-12-01: install done at 305 s of device time, the suite ~1,300 s after it; the limit
    # (SIGINT: the results file is written after every test anyway) leaves ~2 min to collect.
    SGLANG_EXT_FIXTURES_WAIT_S=${FIXTURES_WAIT_S:-900} SUITE_LIMIT=${SUITE_LIMIT:-1380} \
        bash node/gpu_node.sh suite-on 0.5.23 /tmp/site523 0 32000 || true
    touch "$SUITE/DONE"
    ;;
public-on)
    # SITE PORT_BASE: the published-drafter corpus against dummy targets (no fixture needed)
    res="$SUITE/public"
    mkdir -p "$res"
    export SGLANG_EXT_SITE=$1 SGLANG_EXT_LOG_DIR=/tmp/sglang-ext-logs-public PYTHONPATH=$1
    SGLANG_EXT_PORT_BASE=$2 OUT="$res" SUITE_PATHS=tests/gpu/test_public_configs.py \
        timeout -s INT "${PUBLIC_LIMIT:-420}" bash node/gpu_node.sh test
    ;;
one-install)
    bundle=${1:?usage: gpu_node.sh one-install BUNDLE_NAME [DEVICE_SECONDS_LEFT]}
    # The lease's device time left at this call (its budget_left_s): the soak sizes itself to
    # it (tests/gpu/harness.py soak_seconds).
    # (seed-shape-start and speed-one-start have no $SUITE: the 2026-12-02 session's first
    # one-install stopped here, before joining anything)
    mkdir -p "$SUITE"
    if [ -n "${2:-}" ]; then echo $(($(date +%s) + $2)) >"$SUITE/DEADLINE"; fi
    python3 node/ferry.py join "/tmp/ferry/$bundle/manifest.json" --parts "/tmp/ferry/$bundle" \
        --out /tmp
    rm -rf /tmp/bundle && mkdir -p /tmp/bundle /tmp/wh523 && tar -xf "/tmp/$bundle" -C /tmp/bundle
    cp /tmp/bundle/523/*/*.whl /tmp/wh523/
    python3 node/wheelhouse.py verify --lock node/locks/sglang-0.5.23-h200-cu130-py312.lock /tmp/wh523
    bash node/gpu_node.sh install-523
    sync_latest
    touch "$INSTALLED"
    ls "$SUITE"
    ;;
one-wait)
    res="$SUITE/sglang0.5.23"
    one_collect() {
        cp "$res"/integration-*.json "$res/pytest.log" "$OUT"/ 2>/dev/null || true
        cp "$FIX/fixtures.json" "$MLA/mla-fixtures.json" "$OUT"/ 2>/dev/null || true
        tar -czf "$OUT/suite-logs.tgz" -C "$SUITE" pipeline.log fixtures.log mla.log \
            sglang0.5.23/patched.log 2>/dev/null || true
        (cd /tmp/sglang-ext-logs-0.5.23 2>/dev/null && tar -czf "$OUT/server-logs-0.5.23.tgz" \
            server-*.log bench-stdout.txt) 2>/dev/null || true
    }
    # A wait cut off at the call's limit (or at the end of the session's device time) still
    # hands back what the suite has written so far.
    trap 'one_collect; exit 124' TERM
    wait_for "$SUITE" "${1:-540}"
    grep -h "make_fixtures\|Error\|error\|done in" "$SUITE"/fixtures.log "$SUITE"/mla.log 2>/dev/null \
        | tail -n 12
    tail -n 30 "$res/pytest.log" 2>/dev/null
    one_collect
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
    [ -f "$SUITE/DONE" ]
    ;;
dual-go)
    sync_latest
    [ -f "$INSTALLED" ] || { echo "not installed yet (dual-install)" >&2; exit 1; }
    touch "$SUITE/GO"
    ls "$SUITE"
    ;;
pyrun)
    "$@"  # a command with $SGLANG_EXT_SITE's PYTHONPATH
    ;;
smoke)
    # SITE GPU: one EAGLE-3 plugin server on the llama fixture (or the bundled demo with dummy
    # weights), one request, its log -> $OUT. Seconds, before the suites start.
    site=$1 gpu=$2 tgt=$FIX/llama-target drf=$FIX/llama-drafter load=()
    if [ ! -f "$drf/config.json" ]; then
        tgt=sglang_ext/data/demo/target drf=sglang_ext/data/demo/drafter load=(--load-format dummy)
    fi
    log="$OUT/smoke-$(basename "$site").log"
    env -u PYTHONPATH CUDA_VISIBLE_DEVICES=$gpu SGLANG_EXT_SITE=$site bash node/gpu_node.sh pyrun \
        timeout 280 python3 -m sglang.launch_server \
        --model-path "$tgt" "${load[@]}" --speculative-draft-model-path "$drf" \
        --speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 \
        --speculative-num-draft-tokens 4 --attention-backend triton --sampling-backend pytorch \
        --skip-tokenizer-init --cuda-graph-backend-prefill disabled --port 30555 \
        --mem-fraction-static 0.3 --max-total-tokens 65536 --enable-metrics >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 270); do
        curl -sf localhost:30555/health_generate >/dev/null 2>&1 && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 1
    done
    curl -s localhost:30555/generate -H 'content-type: application/json' \
        -d '{"input_ids": [1, 5, 9, 13, 17, 21, 25, 29], "sampling_params": {"max_new_tokens": 32, "temperature": 0}}' \
        | tee -a "$log" | head -c 600
    echo
    kill "$pid" 2>/dev/null || true
    pkill -f "[-]-port 30555" || true
    grep -E "sglang_ext|Error|error|accept" "$log" | tail -n 25
    ;;
dual-install)
    bundle=${1:?usage: gpu_node.sh dual-install BUNDLE_NAME}
    python3 node/ferry.py join "/tmp/ferry/$bundle/manifest.json" --parts "/tmp/ferry/$bundle" \
        --out /tmp
    rm -rf /tmp/bundle && mkdir -p /tmp/bundle && tar -xf "/tmp/$bundle" -C /tmp/bundle
    mkdir -p /tmp/wh523 && cp /tmp/bundle/523/*/*.whl /tmp/wh523/
    cp /tmp/bundle/517/*/*.whl "$WH"/
    python3 node/wheelhouse.py verify --lock node/locks/sglang-0.5.23-h200-cu130-py312.lock /tmp/wh523
    python3 node/wheelhouse.py verify --lock node/locks/sglang-0.5.17-h200-cu130-py312.lock "$WH" \
        --ignore-extra
    SGLANG_EXT_SITE=/tmp/site bash node/gpu_node.sh install-site "$WH"/*.whl &
    p1=$!
    bash node/gpu_node.sh install-523
    wait "$p1"
    touch "$INSTALLED"
    ;;
install-523)
    # 0.5.23's site: its wheels, the training subset's extras it lacks (speculators and what
    # it needs, not its transformers), then the node's CUDA libraries that torch 2.14.1 finds
    # by RPATH next to itself (the lock's notes say which and why).
    extras=()
    for n in speculators hs_connectors datasets multiprocess pydantic_settings python_dotenv loguru; do
        compgen -G "/tmp/wh523/$n-*.whl" >/dev/null && continue
        if ! compgen -G "$WH/$n-*.whl" >/dev/null; then
            # the training subset comes with the first call's .wh/s1 (stage s1, or a
            # start_detached pipeline's train_site); a dummy-bench lease lost 9 s here on
            # 2026-12-07 to pip's "speculators-*.whl is not a valid wheel filename"
            echo "install-523: no $n wheel in $WH; carry .wh/s1 and run 'stage s1' first" >&2
            exit 2
        fi
        extras+=("$WH"/"$n"-*.whl)
    done
    SITE_CHECK=0 SGLANG_EXT_SITE=/tmp/site523 bash node/gpu_node.sh install-site \
        /tmp/wh523/*.whl "${extras[@]}"
    node_nvidia=$(python3 -c 'import nvidia, os; print(os.path.realpath(list(nvidia.__path__)[0]))')
    for d in "$node_nvidia"/*/; do
        d=${d%/}
        [ -e "/tmp/site523/nvidia/$(basename "$d")" ] || ln -s "$d" "/tmp/site523/nvidia/$(basename "$d")"
    done
    ls /tmp/site523/nvidia
    # pip ran with --no-compile (fast); dozens of server processes would each compile the same
    # sources at startup. Once here, on every core, instead.
    python3 -m compileall -q -j 0 /tmp/site523 >/dev/null 2>&1 || true
    SGLANG_EXT_SITE=/tmp/site523 bash node/gpu_node.sh site-check
    ;;
install-site)
    # wheels (--no-deps) + this project into $SGLANG_EXT_SITE; print what imports from there
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "$@"
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target "$SITE" .
    if [ "${SITE_CHECK:-1}" = 1 ]; then bash node/gpu_node.sh site-check; fi
    ;;
site-check)
    PYTHONPATH=$SITE python3 - <<'PY'
import importlib.metadata as md, json, torch
names = ("sglang", "sglang-ext", "transformers", "tokenizers", "speculators", "sglang-kernel",
         "flashinfer-python", "triton", "nvidia-nccl-cu13")
print(json.dumps({n: md.version(n) for n in names} | {"torch": torch.__version__,
      "cuda": torch.cuda.is_available(), "gpus": torch.cuda.device_count(),
      "nccl": torch.cuda.nccl.version()}))
print([ep.name for ep in md.entry_points(group="sglang.srt.plugins")])
PY
    ;;
dual-wait)
    wait_for "$SUITE" "${1:-540}"
    grep -h "make_fixtures\|Error\|error" "$SUITE"/fixtures.log "$SUITE"/mla.log 2>/dev/null | tail -n 12
    for v in 0.5.23 0.5.17; do
        echo "== sglang $v"
        tail -n 15 "$SUITE/sglang$v/pytest.log" 2>/dev/null
        mkdir -p "$OUT/sglang$v"
        cp "$SUITE/sglang$v"/integration-*.json "$SUITE/sglang$v/pytest.log" "$OUT/sglang$v"/ \
            2>/dev/null || true
    done
    cp "$FIX/fixtures.json" "$MLA/mla-fixtures.json" "$OUT"/ 2>/dev/null || true
    tar -czf "$OUT/suite-logs.tgz" -C "$SUITE" pipeline.log fixtures.log mla.log \
        sglang0.5.23/patched.log sglang0.5.17/patched.log 2>/dev/null || true
    for v in 0.5.23 0.5.17; do  # the servers the seed case, window and tau tests read
        (cd "/tmp/sglang-ext-logs-$v" 2>/dev/null && tar -czf "$OUT/server-logs-$v.tgz" \
            server-mla_* server-plugin.log server-nospec.log server-window.log server-patched.log) \
            2>/dev/null || true
    done
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
    [ -f "$SUITE/DONE" ]
    ;;
*)
    echo "unknown step: $step" >&2
    exit 2
    ;;
esac
