#!/usr/bin/env bash
# Regenerates the committed Python stubs (and their .pyi) from protos/.
# CI runs this and fails when the result differs from what is committed.
# protos/vendor holds third-party imports (google/api/field_behavior.proto): protoc reads them,
# but only quarry/v1 is generated; at runtime the stubs import googleapis-common-protos' modules.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -f quarry/v1/*_pb2.py quarry/v1/*_pb2.pyi quarry/v1/*_pb2_grpc.py quarry/v1/*_pb2_grpc.pyi
python3 -m grpc_tools.protoc \
  --proto_path=protos \
  --proto_path=protos/vendor \
  --python_out=. \
  --mypy_out=. \
  --grpc_python_out=. \
  --mypy_grpc_out=. \
  protos/quarry/v1/*.proto
