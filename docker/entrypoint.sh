#!/usr/bin/env bash
# Entrypoint of the sglang-ext images (docker/Dockerfile and docker/Dockerfile.patched).
#
# With no arguments, or with arguments that all start with "-", it serves an EAGLE-3
# speculative-decoding endpoint with `sglang serve`. The target model, the drafter and the
# speculative settings come from the SGLANG_EXT_* environment variables documented in
# docker/README.md; the container arguments are appended to `sglang serve` unchanged, after
# the flags set here, so they can add any SGLang flag and override the single-valued ones.
#
# With a first argument that is not an option (`sglang-ext bench ...`, `bash`, ...), it runs
# that command instead of the server.
set -euo pipefail

log() { printf 'sglang-ext entrypoint: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 64 # EX_USAGE: the container was started with a bad configuration
}

usage() {
    cat <<'EOF'
Serves an EAGLE-3 speculative-decoding endpoint (sglang serve) with a speculators drafter.

Environment (see docker/README.md):
  SGLANG_EXT_TARGET            target model: directory or Hugging Face repo id (required)
  SGLANG_EXT_DRAFT             EAGLE-3 drafter: directory or Hugging Face repo id (required)
  SGLANG_EXT_NUM_STEPS         --speculative-num-steps (default 3)
  SGLANG_EXT_TOPK              --speculative-eagle-topk (default 1)
  SGLANG_EXT_NUM_DRAFT_TOKENS  --speculative-num-draft-tokens (default 4)
  SGLANG_EXT_TP                --tp-size (default 1)
  SGLANG_EXT_HOST              --host (default 0.0.0.0)
  SGLANG_EXT_PORT              --port (default 30000)
  SGLANG_EXT_MEM_FRACTION      --mem-fraction-static (default: SGLang's choice)
  SGLANG_EXT_DOCTOR            1: run `sglang-ext doctor` on the drafter first (default 1)

Arguments starting with "-" are appended to `sglang serve`; any other first argument is
run as a command instead of the server (e.g. `sglang-ext bench --url ...`).
EOF
}

if [[ $# -gt 0 ]]; then
    case "$1" in
        -h | --help)
            usage
            exit 0
            ;;
        -*) ;; # extra flags for sglang serve
        *) exec "$@" ;;
    esac
fi

target="${SGLANG_EXT_TARGET:-}"
draft="${SGLANG_EXT_DRAFT:-}"
num_steps="${SGLANG_EXT_NUM_STEPS:-3}"
topk="${SGLANG_EXT_TOPK:-1}"
num_draft_tokens="${SGLANG_EXT_NUM_DRAFT_TOKENS:-4}"
tp="${SGLANG_EXT_TP:-1}"
host="${SGLANG_EXT_HOST:-0.0.0.0}"
port="${SGLANG_EXT_PORT:-30000}"
mem_fraction="${SGLANG_EXT_MEM_FRACTION:-}"
doctor="${SGLANG_EXT_DOCTOR:-1}"

[[ -n "$target" ]] || die "SGLANG_EXT_TARGET is not set. Set it to the target model, e.g." \
    "-e SGLANG_EXT_TARGET=/models/Llama-3.1-8B-Instruct (a directory mounted into the" \
    "container, or a Hugging Face repo id)."
[[ -n "$draft" ]] || die "SGLANG_EXT_DRAFT is not set. Set it to the EAGLE-3 drafter trained" \
    "with speculators, e.g. -e SGLANG_EXT_DRAFT=/models/Llama-3.1-8B-Instruct-eagle3."

positive_int() { # name value
    [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '$2'."
}
positive_int SGLANG_EXT_NUM_STEPS "$num_steps"
positive_int SGLANG_EXT_TOPK "$topk"
positive_int SGLANG_EXT_NUM_DRAFT_TOKENS "$num_draft_tokens"
positive_int SGLANG_EXT_TP "$tp"
positive_int SGLANG_EXT_PORT "$port"
if [[ -n "$mem_fraction" && ! "$mem_fraction" =~ ^(0?\.[0-9]+|1(\.0*)?)$ ]]; then
    die "SGLANG_EXT_MEM_FRACTION must be a fraction in (0, 1], got '$mem_fraction'."
fi
if [[ "$topk" == 1 && "$num_draft_tokens" != $((num_steps + 1)) ]]; then
    log "warning: with SGLANG_EXT_TOPK=1 SGLang uses num_steps + 1 = $((num_steps + 1))" \
        "draft tokens, not SGLANG_EXT_NUM_DRAFT_TOKENS=$num_draft_tokens."
fi

case "$doctor" in
    1 | true | yes)
        command -v sglang-ext >/dev/null 2>&1 ||
            die "SGLANG_EXT_DOCTOR=$doctor but the sglang-ext CLI is not installed in this" \
                "image (the fork image has no plugin). Set SGLANG_EXT_DOCTOR=0."
        log "checking the drafter: sglang-ext doctor $draft --target $target"
        status=0
        sglang-ext doctor "$draft" --target "$target" || status=$?
        if [[ $status -ne 0 ]]; then
            log "error: sglang-ext doctor refused the drafter $draft for target $target" \
                "(exit $status; its report is above). Not starting the server." \
                "Fix the drafter, or set SGLANG_EXT_DOCTOR=0 to serve it anyway."
            if [[ ! -d "$draft" || ! -e "$target" ]]; then
                log "note: the doctor reads local directories; a Hugging Face repo id needs" \
                    "SGLANG_EXT_DOCTOR=0 (or download the model and mount it)."
            fi
            exit "$status"
        fi
        ;;
    0 | false | no) log "SGLANG_EXT_DOCTOR=$doctor: not checking the drafter." ;;
    *) die "SGLANG_EXT_DOCTOR must be 1 or 0, got '$doctor'." ;;
esac

args=(
    serve
    --model-path "$target"
    --speculative-algorithm EAGLE3
    --speculative-draft-model-path "$draft"
    --speculative-num-steps "$num_steps"
    --speculative-eagle-topk "$topk"
    --speculative-num-draft-tokens "$num_draft_tokens"
    --tp-size "$tp"
    --host "$host"
    --port "$port"
    --enable-metrics
)
if [[ -n "$mem_fraction" ]]; then
    args+=(--mem-fraction-static "$mem_fraction")
fi

log "exec sglang ${args[*]} $*"
exec sglang "${args[@]}" "$@"
