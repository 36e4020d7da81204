# The generated gRPC stubs of proto/kvcache/v1/kvcache.proto (kvcache_pb2.py,
# kvcache_pb2_grpc.py) land here; the build makes them, nobody edits them.
