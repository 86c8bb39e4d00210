# Answers other than 2xx in a gateway's Prometheus text, by status and error code, from
# tollgate_requests_total (status 000: the client left before the answer). Used by
# scripts/bench.py and scripts/saturate.sh: wrk counts non-2xx answers without their status.
/^tollgate_requests_total\{/ { seen = 1 }
/^tollgate_requests_total\{/ && !/status="2/ {
    match($0, /status="[^"]*"/); s = substr($0, RSTART + 8, RLENGTH - 9)
    match($0, /code="[^"]*"/); c = substr($0, RSTART + 6, RLENGTH - 7)
    n[s " " c] += $NF
}
END {
    if (!seen) { print "not recorded (metrics off)"; exit }
    for (k in n) printf "%s: %d; ", k, n[k]
    if (length(n) == 0) printf "none"
    printf "\n"
}
