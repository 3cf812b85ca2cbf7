# Sourced by deploy/compose/test-compose.sh and deploy/kubernetes/test-start.sh: re-runs the calling
# script as `SCRIPT --inside WORK` in a private network and mount namespace, with TIDAL resolved and
# a fresh WORK dir (removed on success, kept and named on failure), and exits with its status. Not
# root (no unshare or setpriv): "skipped: ..." and success, unless TIDAL_DEPLOY_CHECK_STRICT=1.
#
#   in_namespace NAME SCRIPT ARGS...   (returns only when ARGS already start with --inside)
in_namespace() {
    local name="$1" script="$2"
    shift 2
    [ "${1:-}" = "--inside" ] && return 0
    local tidal work status=0
    tidal="$(realpath "${TIDAL:?TIDAL must name the tidal binary}")"
    if ! unshare -m -n true 2>/dev/null || ! command -v setpriv > /dev/null; then
        echo "skipped: unshare -m -n or setpriv is not available here (needs root)"
        [ "${TIDAL_DEPLOY_CHECK_STRICT:-0}" = "1" ] && exit 1
        exit 0
    fi
    work="$(mktemp -d)"
    chmod 0755 "$work"
    TIDAL="$tidal" unshare -m -n bash "$script" --inside "$work" || status=$?
    if [ "$status" = 0 ]; then
        rm -rf "$work"
    else
        echo "$name: FAILED; logs kept in $work" >&2
    fi
    exit "$status"
}
