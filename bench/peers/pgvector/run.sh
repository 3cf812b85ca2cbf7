#!/usr/bin/env bash
# The pgvector peer lives beside hnswlib's in ann/ (it imports hnsw_peer.py's embeddings); this
# file only gives it a name run-all.sh knows. 1M x 128 needs more than run-all's 600 s:
#   PEER_TIMEOUT=3600 bash bench/peers/run-all.sh pgvector     (the knobs: ann/pgvector.sh)
exec bash "$(dirname "${BASH_SOURCE[0]}")/../ann/pgvector.sh" "$@"
