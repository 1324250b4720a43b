#!/usr/bin/env bash
# compare.sh: allot against gubernator v2.13.0, on this machine, in one run,
# with the same load generator and the same load shapes.
#
# It builds allot and deploy/bench/gubernator-target (`allot bench` plus a
# gubernator --system, a module of its own), installs gubernator with
# `go install` unless GUBERNATOR names a binary, starts both servers on
# loopback (single node, in memory), and runs, for each system in turn:
#   closed loop, CONCURRENCY in flight, DURATION
#   open loop at half of allot's closed-loop peak
#   open loop at RATE checks/s
# every load over KEYS keys (user=<n>: allot's example per-user limit,
# 10/s burst 5, and the same leaky bucket in gubernator) and CONNS gRPC
# connections, after a short warm-up.
# Then it prints a side-by-side table and stops both servers.
#
# Usage: deploy/bench/compare.sh   (env: DURATION CONCURRENCY KEYS RATE CONNS GUBERNATOR)
set -euo pipefail

DURATION=${DURATION:-10s}
CONCURRENCY=${CONCURRENCY:-128}
KEYS=${KEYS:-10000}
RATE=${RATE:-6000}
CONNS=${CONNS:-1}
ALLOT_GRPC=127.0.0.1:18081 ALLOT_HTTP=127.0.0.1:18080
GUBER_GRPC=127.0.0.1:19091 GUBER_HTTP=127.0.0.1:19090 GUBER_GOSSIP=127.0.0.1:19946

cd "$(dirname "$0")/../.."
work=$(mktemp -d)
pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT

echo "building allot, the gubernator target and gubernator v2.13.0 ..." >&2
go build -o "$work/allot" ./cmd/allot
# -mod=mod: the target follows allot's own requirements through its replace
# directive, so a change to allot's go.mod may call for a tidy here.
(cd deploy/bench/gubernator-target && go build -mod=mod -o "$work/gubernator-target" .)
if [[ -z ${GUBERNATOR:-} ]]; then
	GOBIN=$work go install github.com/gubernator-io/gubernator/v2/cmd/gubernator@v2.13.0
	GUBERNATOR=$work/gubernator
fi

# wait_ready URL PID: poll URL until it answers, for at most 10 s.
wait_ready() {
	for _ in $(seq 100); do
		kill -0 "$2" 2>/dev/null || { echo "server $2 exited; its log:" >&2; cat "$work"/*.log >&2; exit 1; }
		curl -fsS -o /dev/null "$1" 2>/dev/null && return
		sleep 0.1
	done
	echo "$1 did not answer in 10 s" >&2
	exit 1
}

# Plain text on loopback: every process says so with --insecure.
"$work/allot" regional --insecure --config deploy/examples/limits.yaml --region bench \
	--grpc-addr "$ALLOT_GRPC" --http-addr "$ALLOT_HTTP" --log-level warn >"$work/allot.log" 2>&1 &
pids+=($!)
wait_ready "http://$ALLOT_HTTP/readyz" $!

# Single node: memberlist discovery that knows only itself.
GUBER_GRPC_ADDRESS=$GUBER_GRPC GUBER_HTTP_ADDRESS=$GUBER_HTTP GUBER_ADVERTISE_ADDRESS=$GUBER_GRPC \
	GUBER_MEMBERLIST_ADDRESS=$GUBER_GOSSIP GUBER_MEMBERLIST_BIND_ADDRESS=$GUBER_GOSSIP \
	GUBER_MEMBERLIST_KNOWN_NODES=$GUBER_GOSSIP GUBER_LOG_LEVEL=warn OTEL_TRACES_EXPORTER=none \
	"$GUBERNATOR" >"$work/gubernator.log" 2>&1 &
pids+=($!)
wait_ready "http://$GUBER_HTTP/v1/HealthCheck" $!

# bench SYSTEM ARGS...: one run; prints the load generator's report.
bench() {
	local system=$1
	shift
	set -- --keys "$KEYS" --concurrency "$CONCURRENCY" --conns "$CONNS" "$@"
	case $system in
	allot) "$work/allot" bench --insecure --target "$ALLOT_GRPC" "$@" ;;
	gubernator) "$work/gubernator-target" --system gubernator --insecure --target "$GUBER_GRPC" "$@" ;;
	esac
}

# field NAME REPORT: the value of one line of a report.
field() { awk -v k="$1" '$1 == k { print $2 }' <<<"$2"; }

rows=()
# measure LABEL ARGS...: runs the load on both systems, adds two rows and
# leaves allot's throughput in allot_throughput.
measure() {
	local label=$1 system out
	shift
	for system in allot gubernator; do
		echo "$label: $system ..." >&2
		out=$(bench "$system" --duration "$DURATION" "$@")
		if [[ $system == allot ]]; then allot_throughput=$(field throughput "$out"); fi
		rows+=("$(printf '%-30s %-11s %9s %9s %9s %9s %9s %7s %7s' "$label" "$system" \
			"$(field throughput "$out")" "$(field p50 "$out")" "$(field p99 "$out")" \
			"$(field p999 "$out")" "$(field max "$out")" "$(field errors "$out")" "$(field unsent "$out")")")
	done
}

read -r load_before _ </proc/loadavg
for system in allot gubernator; do
	echo "warm-up: $system ..." >&2
	bench "$system" --duration 2s >/dev/null
done

measure "closed loop, $CONCURRENCY in flight"
half=$((allot_throughput / 2))
measure "open loop at $half/s" --rate "$half"
measure "open loop at $RATE/s" --rate "$RATE"

echo
echo "$(nproc) cores, $(go env GOVERSION), load generator on the same cores; $KEYS keys, $DURATION per run, at most $CONCURRENCY in flight on $CONNS connection(s)"
echo "load average (1 min) before the runs: $load_before (other work on the machine skews the figures)"
printf '%-30s %-11s %9s %9s %9s %9s %9s %7s %7s\n' load system checks/s "p50 ms" "p99 ms" "p999 ms" "max ms" errors unsent
printf '%s\n' "${rows[@]}"
