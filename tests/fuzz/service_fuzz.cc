// libFuzzer target: every gRPC method of the cache service fed arbitrary request bytes, in
// process. A real KvCacheService over a real ChunkStore (RAM + SSD tiers, RocksDB index)
// and namespace registry in a temporary folder, behind a gRPC server reached through its
// in-process channel, with two tenants' tokens; tenant a has registered the mini model.
//
// An input is: byte 0 the method, byte 1 the caller (a, b, no token, a wrong token), then
// the request messages, separated by the bytes "\xff\xfe" (a unary method takes one; Store
// is a stream). They go on the wire as they are — unparseable messages included. Whatever
// they are, the server answers with a status that is not a server fault (UNKNOWN,
// INTERNAL, DATA_LOSS), never lets a caller other than a see or change a's namespace, and
// keeps serving.
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "base/check.h"
#include "cachesvc/auth.h"
#include "cachesvc/log.h"
#include "cachesvc/namespace_registry.h"
#include "cachesvc/service.h"
#include "kvcache/v1/kvcache.pb.h"
#include "storage/chunk_store.h"

namespace {

namespace pb = ::kvcache::v1;
using kvc::cachesvc::Authenticator;
using kvc::cachesvc::KvCacheService;
using kvc::cachesvc::NamespaceRegistry;

constexpr const char* kMethods[] = {"RegisterNamespace",
                                    "Lookup",
                                    "Fetch",
                                    "Store",
                                    "Pin",
                                    "Unpin",
                                    "Delete",
                                    "Stats",
                                    "FetchRefs",
                                    "ReleaseRefs",
                                    "FetchDeviceRefs"};
constexpr const char* kCallers[] = {"fuzz-token-a", "fuzz-token-b", "", "fuzz-token-c"};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Fixture {
  std::string dir;
  Authenticator auth;
  std::unique_ptr<kvc::storage::ChunkStore> store;
  std::unique_ptr<NamespaceRegistry> registry;
  std::unique_ptr<KvCacheService> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<grpc::GenericStub> stub;
  uint32_t ns_a = 0;

  Fixture() {
    // Refused calls are logged at info: thousands a second here. Server faults still show.
    kvc::cachesvc::SetLogLevel(kvc::cachesvc::LogLevel::kError);
    google::protobuf::SetLogHandler(nullptr);  // "invalid UTF-8" on every mangled string
    char tmpl[] = "/tmp/kvc-service-fuzz-XXXXXX";
    dir = mkdtemp(tmpl);
    std::ofstream(dir + "/tokens") << "fuzz-token-a a\nfuzz-token-b b\n";
    absl::StatusOr<Authenticator> a = Authenticator::FromFile(dir + "/tokens");
    KVC_CHECK(a.ok()) << a.status();
    auth = *std::move(a);
    const std::string config = ReadAll("configs/mini.json");
    KVC_CHECK(!config.empty()) << "run from the repository root (configs/mini.json)";
    // Tenant a maps a RAM pool of its own (FetchRefs); b uses no shared memory.
    absl::StatusOr<kvc::cachesvc::ShmAccess> shm =
        kvc::cachesvc::ShmAccess::Plan("a=8M", /*auth_enabled=*/true, 16ull << 20);
    KVC_CHECK(shm.ok()) << shm.status();
    kvc::storage::StoreOptions o;
    o.data_dir = dir + "/data";
    o.max_chunk_bytes = 1 << 20;
    o.ram_bytes = shm->default_pool_bytes();
    o.ram_pool_bytes = shm->private_pool_bytes();
    o.ssd_bytes = 32ull << 20;
    o.slab_bytes = 16ull << 20;
    absl::StatusOr<std::unique_ptr<kvc::storage::ChunkStore>> s = kvc::storage::ChunkStore::Open(o);
    KVC_CHECK(s.ok()) << s.status();
    store = *std::move(s);
    absl::StatusOr<std::unique_ptr<NamespaceRegistry>> r = NamespaceRegistry::Open(dir, 64);
    KVC_CHECK(r.ok()) << r.status();
    registry = *std::move(r);
    kvc::cachesvc::ServiceOptions opt;
    opt.max_chunk_bytes = o.max_chunk_bytes;
    opt.executor_threads = 2;
    opt.max_keys_per_call = 4096;
    opt.max_lookup_tokens = 1 << 16;
    opt.shm = *shm;
    service = std::make_unique<KvCacheService>(store.get(), registry.get(), &auth, opt);
    grpc::ServerBuilder b;
    b.RegisterService(service.get());
    server = b.BuildAndStart();
    KVC_CHECK(server != nullptr);
    stub = std::make_unique<grpc::GenericStub>(server->InProcessChannel(grpc::ChannelArguments()));
    // Tenant a's namespace, which nobody else may see.
    pb::RegisterNamespaceRequest reg;
    reg.set_model_config_json(config);
    reg.set_model_id("mini-fuzz");
    reg.set_chunk_tokens(64);
    std::string reply;
    const grpc::Status st = Call(0, 0, {reg.SerializeAsString()}, &reply);
    KVC_CHECK(st.ok()) << st.error_message();
    pb::RegisterNamespaceResponse resp;
    KVC_CHECK(resp.ParseFromString(reply));
    ns_a = resp.namespace_id();
  }

  // One call of kMethods[method] as kCallers[caller], the messages sent as they are; the
  // last message received goes to *reply.
  grpc::Status Call(size_t method, size_t caller, const std::vector<std::string>& messages,
                    std::string* reply) {
    grpc::ClientContext ctx;
    if (*kCallers[caller] != '\0') {
      ctx.AddMetadata("authorization", std::string("Bearer ") + kCallers[caller]);
    }
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::CompletionQueue cq;
    auto call =
        stub->PrepareCall(&ctx, std::string("/kvcache.v1.KVCache/") + kMethods[method], &cq);
    void* tag;
    bool ok;
    auto wait = [&] {
      KVC_CHECK(cq.Next(&tag, &ok));
      return ok;
    };
    call->StartCall(nullptr);
    bool open = wait();
    for (const std::string& m : messages) {
      if (!open) break;
      grpc::Slice slice(m);
      grpc::ByteBuffer buf(&slice, 1);
      call->Write(buf, nullptr);
      open = wait();
    }
    if (open) {
      call->WritesDone(nullptr);
      wait();
    }
    grpc::ByteBuffer in;
    while (true) {
      call->Read(&in, nullptr);
      if (!wait()) break;
      std::vector<grpc::Slice> slices;
      (void)in.Dump(&slices);
      reply->clear();
      for (const grpc::Slice& s : slices)
        reply->append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    grpc::Status status;
    call->Finish(&status, nullptr);
    wait();
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    return status;
  }
};

Fixture& Get() {
  static Fixture* f = new Fixture();  // lives for the whole run
  return *f;
}

// The namespace a parsed request names, if it parses and has one.
template <typename Request>
std::optional<uint32_t> NamespaceOf(const std::string& bytes) {
  Request r;
  if (!r.ParseFromString(bytes)) return std::nullopt;
  return r.namespace_id();
}

std::optional<uint32_t> NamespaceOf(size_t method, const std::string& bytes) {
  switch (method) {
    case 1:
      return NamespaceOf<pb::LookupRequest>(bytes);
    case 2:
      return NamespaceOf<pb::FetchRequest>(bytes);
    case 3:
      return NamespaceOf<pb::StoreRequest>(bytes);
    case 4:
      return NamespaceOf<pb::PinRequest>(bytes);
    case 5:
      return NamespaceOf<pb::UnpinRequest>(bytes);
    case 6:
      return NamespaceOf<pb::DeleteRequest>(bytes);
    case 8:
    case 10:
      return NamespaceOf<pb::FetchRefsRequest>(bytes);
    default:
      return std::nullopt;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  Fixture& f = Get();
  const size_t method = data[0] % std::size(kMethods);
  const size_t caller = data[1] % std::size(kCallers);
  const std::string body(reinterpret_cast<const char*>(data + 2), size - 2);
  std::vector<std::string> messages;
  for (size_t start = 0;;) {
    const size_t sep = body.find("\xff\xfe", start);
    messages.push_back(body.substr(start, sep == std::string::npos ? sep : sep - start));
    if (sep == std::string::npos || messages.size() == 16) break;
    start = sep + 2;
  }
  std::string reply;
  const grpc::Status st = f.Call(method, caller, messages, &reply);
  const grpc::StatusCode code = st.error_code();
  KVC_CHECK(code != grpc::StatusCode::UNKNOWN && code != grpc::StatusCode::INTERNAL &&
            code != grpc::StatusCode::DATA_LOSS)
      << kMethods[method] << " answered a server fault to a client's bytes: " << code << " "
      << st.error_message();
  // Only tenant a reaches its namespace.
  if (caller != 0 && st.ok()) {
    for (const std::string& m : messages) {
      const std::optional<uint32_t> ns = NamespaceOf(method, m);
      KVC_CHECK(!ns || *ns != f.ns_a)
          << kMethods[method] << " by caller " << caller << " succeeded on tenant a's namespace";
    }
  }
  return 0;
}
