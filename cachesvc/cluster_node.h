// A kvcached node's identity in a cluster: its id and generation, kept in the data folder
// so that a node restarted on the same folder rejoins as the same node (and serves the
// chunks on its SSD again), one generation later.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "cluster/membership.h"

namespace kvc::cachesvc {

// `requested_id` empty: the id this folder had, or a new random one ("node-" + 8 hex
// digits) saved in DATA_DIR/node_id. Set: it must match the folder's (a folder holds one
// node's chunks) or the folder must be new. The generation in DATA_DIR/node_generation
// goes up by one per call. DATA_DIR/node_instance holds the folder's random instance id
// (NodeInfo::instance), made at the first call.
absl::StatusOr<cluster::NodeInfo> LoadNodeIdentity(const std::string& data_dir,
                                                   const std::string& requested_id);

}  // namespace kvc::cachesvc
