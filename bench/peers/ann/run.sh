#!/usr/bin/env bash
# The approximate feed index's peer (decisions/067): hnswlib's HNSW over the bench's clustered
# embeddings, in process: the index itself, without a server around it. pgvector, the same index
# inside a server, is measured by ann/pgvector.sh (built from source: Debian 12 has no package);
# Qdrant's server is not in the registries this machine reaches. Not in run-all.sh's default list
# (it builds a 1M index: minutes); run it by name:
#   bash bench/peers/run-all.sh ann            ITEMS=1000000 DIM=128 by default
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
if ! (cd / && "$VENV/bin/python" -c 'import hnswlib, numpy' 2>/dev/null); then
  echo "ann: pip install hnswlib numpy into $VENV" >&2
  "$VENV/bin/python" -m pip install -q 'hnswlib>=0.8,<0.9' 'numpy>=1.24,<3'
fi
"$VENV/bin/python" "$ROOT/ann/hnsw_peer.py" "${ITEMS:-1000000}" "${DIM:-128}" "${QUERIES:-200}"
