# Sourced by scripts/install_{vllm,sglang,sglang_release}_cpu.sh. A cached install's stamp holds
# the state its import check last passed on: a rerun that finds the same state skips the check
# (each imports torch and the engine: 10-13 s apiece on 2 cores, three of them every CI run);
# any other state (a distribution installed, removed or upgraded, another Python) runs the check
# again, and a failed check reinstalls as before.

# One line for PYTHON's real path and version and the names in each DIR (a site-packages
# folder: every *.dist-info folder in it names one distribution and its version).
stamp_state() {
    local py="$1"; shift
    { readlink -f "$py"; "$py" -c 'import sys; print(sys.version)'; ls -- "$@"; } \
        | sha256sum | cut -d' ' -f1
}

# True where STAMP exists and either holds STATE or the import check (the rest of the
# arguments) passes now; then STAMP is rewritten with STATE.
stamp_reusable() {
    local stamp="$1" state="$2"; shift 2
    [[ -f "$stamp" ]] || return 1
    [[ "$(cat "$stamp")" == "$state" ]] && return 0
    "$@" && echo "$state" > "$stamp"
}
