"""Generated quarry.v1 protobuf and gRPC stubs; regenerate with scripts/gen_protos.sh."""
