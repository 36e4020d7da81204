// Compiled without the generated protobuf/gRPC include path (tests/CMakeLists.txt): if a
// public client header pulls in generated code or gRPC, the build fails here. A worker
// that links the client includes plain C++ only.
#include "client/cache_api.h"
#include "client/client.h"
#include "client/cluster_client.h"
#include "client/prefix_hash.h"

namespace kvc::client {

// Names the public types so a header that stopped declaring them fails too.
[[maybe_unused]] void NamePublicTypes(CacheApi*, CacheClient*, ClusterClient*, LookupResult*,
                                      StoreResult*, Tier, Durability) {}

}  // namespace kvc::client
