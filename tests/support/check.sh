# The pass/fail bookkeeping the shell tests share (sourced, not run):
# `check DESCRIPTION CONDITION...` runs the condition, prints "ok:" or
# "FAIL:" with the description and counts failures; `check_summary`, the
# script's last command, prints the count and fails when any check did.
# Not here: the tests' own predicates, setup or cleanup.
failures=0

check() { # check DESCRIPTION CONDITION...
    local what=$1
    shift
    if "$@"; then
        echo "ok: $what"
    else
        echo "FAIL: $what"
        failures=$((failures + 1))
    fi
}

check_summary() {
    echo "$failures check(s) failed"
    [ "$failures" -eq 0 ]
}
