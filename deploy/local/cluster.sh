#!/usr/bin/env bash
# A local multi-region cluster of real processes on loopback (README.md):
#   deploy/local/cluster.sh up [--dir D] [--base-port P] [--config FILE] ...
#   deploy/local/cluster.sh status [--dir D]
#   deploy/local/cluster.sh down [--dir D] [--grace 10s]
# It builds bin/allot from this checkout (ALLOT_BIN names another binary)
# and runs `allot cluster "$@"`. Needs Go and redis-server.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${ALLOT_BIN:-$root/bin/allot}"
if [ -z "${ALLOT_BIN:-}" ] && { [ "${1:-}" = up ] || [ ! -x "$bin" ]; }; then
  command -v go >/dev/null || { echo "cluster.sh: go is missing (Go 1.26)" >&2; exit 1; }
  (cd "$root" && go build -o "$bin" ./cmd/allot)
fi
if [ "${1:-}" = up ] && ! command -v redis-server >/dev/null; then
  echo "cluster.sh: redis-server is missing: apt-get install redis-server" >&2
  exit 1
fi
exec "$bin" cluster "$@"
