#!/usr/bin/env bash
# The two-node rows of the Ascend matrix (scenarios/ascend_nightly.yaml, marked nodes2) on ONE runner with two
# agents: one `parity run --node-rank N --master-addr 127.0.0.1` per node, as two Ascend nodes run them (each
# launcher derives HCCL_IF_IP / *_SOCKET_IFNAME for the route to the master, each node leases its own cards of
# this host), node 0 judging and writing parity-out/LANE/. No lane has two runners (verl's own multi-node job is a
# KubeRay RayJob: docs/ascend.md "Multi-node"); this exercises the same launch and collectives across agents.
#
#   ci/two_nodes.sh LANE VENV     (after ci/nightly.sh npu made VENV)
# Environment: PARITY_TWO_NODE_ROWS  the rows' -k expression (required); PARITY_K: a further -k, ANDed
set -euo pipefail
lane=${1:?usage: ci/two_nodes.sh LANE VENV}
venv=${2:?usage: ci/two_nodes.sh LANE VENV}
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
. "$venv/bin/activate"
select="(${PARITY_TWO_NODE_ROWS:?PARITY_TWO_NODE_ROWS must select the two-node rows})"
if [ -n "${PARITY_K:-}" ]; then select="$select and ($PARITY_K)"; fi
# the checkout's parity/ folder must not shadow the harness installed from the wheelhouse in the ranks torchrun
# starts with `python -m` from this directory (ci/nightly.sh runs pytest with -P for the same reason)
export PYTHONSAFEPATH=1
out="parity-out/$lane"
rm -rf "$out" "$out-node1"
port=$(python -P -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
common=(scenarios/ascend_nightly.yaml -k "$select" --device npu --master-addr 127.0.0.1 --master-port "$port")
mkdir -p "$out-node1"
parity run "${common[@]}" --node-rank 1 --out "$out-node1" >"$out-node1.log" 2>&1 &
node1=$!
rc=0
parity run "${common[@]}" --node-rank 0 --out "$out" --require scenarios/ascend_nightly.yaml || rc=$?
# node 1 ends with node 0's last row; one that waits on past it (node 0 died before its rendezvous) is stopped
for _ in $(seq 1 60); do kill -0 "$node1" 2>/dev/null || break; sleep 1; done
if kill -0 "$node1" 2>/dev/null; then
  echo "::error title=two-node rows ($lane)::node 1 still waited 60 s after node 0 ended: stopped"
  kill -- "$node1" 2>/dev/null || true
fi
node1_rc=0
wait "$node1" || node1_rc=$?
if [ "$node1_rc" -ne 0 ]; then
  echo "::error title=two-node rows ($lane)::node 1 exited with $node1_rc (its log below)"
  tail -n 40 "$out-node1.log"
  [ "$rc" -ne 0 ] || rc=$node1_rc
fi
exit "$rc"
