#include "cachesvc/cluster_node.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace kvc::cachesvc {
namespace {

std::string ReadTrimmed(const std::string& path, bool* exists) {
  std::ifstream in(path);
  *exists = static_cast<bool>(in);
  std::stringstream s;
  s << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(s.str()));
}

// Written to a temporary file, synced and renamed: a crash leaves the old or the new.
absl::Status WriteSynced(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", strerror(errno)));
  const bool ok =
      write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && fsync(fd) == 0;
  close(fd);
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<cluster::NodeInfo> LoadNodeIdentity(const std::string& data_dir,
                                                   const std::string& requested_id) {
  cluster::NodeInfo n;
  bool exists = false;
  const std::string id_path = data_dir + "/node_id";
  const std::string saved = ReadTrimmed(id_path, &exists);
  if (exists && !requested_id.empty() && saved != requested_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("--node-id ", requested_id, ": the data folder ", data_dir,
                     " belongs to node ", saved, " (one folder holds one node's chunks)"));
  }
  n.id = exists ? saved : requested_id;
  if (n.id.empty()) {
    std::random_device rd;
    n.id = absl::StrFormat("node-%08x", rd());
  }
  KVC_RETURN_IF_ERROR(cluster::CheckNodeId(n.id));
  if (!exists) {
    KVC_RETURN_IF_ERROR(WriteSynced(id_path, n.id + "\n"));
  }
  const std::string gen_path = data_dir + "/node_generation";
  uint64_t gen = 0;
  const std::string gen_text = ReadTrimmed(gen_path, &exists);
  if (exists && !absl::SimpleAtoi(gen_text, &gen)) {
    return absl::DataLossError(absl::StrCat(gen_path, " holds \"", gen_text, "\", not a number"));
  }
  n.generation = gen + 1;
  KVC_RETURN_IF_ERROR(WriteSynced(gen_path, absl::StrCat(n.generation, "\n")));
  n.started_unix = static_cast<int64_t>(time(nullptr));
  // The folder's instance: made once, so that a restart on this folder is known for this
  // node's own (membership.h) and a process on another folder claiming the id is not.
  const std::string instance_path = data_dir + "/node_instance";
  n.instance = ReadTrimmed(instance_path, &exists);
  if (!exists || n.instance.size() != 32) {
    std::random_device rd;
    n.instance = absl::StrFormat("%08x%08x%08x%08x", rd(), rd(), rd(), rd());
    KVC_RETURN_IF_ERROR(WriteSynced(instance_path, n.instance + "\n"));
  }
  return n;
}

}  // namespace kvc::cachesvc
