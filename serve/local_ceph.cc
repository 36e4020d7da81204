#include "serve/local_ceph.h"

#include <signal.h>

#include <cstdlib>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvc::serve {

absl::StatusOr<std::unique_ptr<LocalCeph>> LocalCeph::Start(const std::string& source_dir,
                                                            const std::string& dir,
                                                            const std::string& pool,
                                                            uint64_t osd_bytes) {
  const std::string log = dir + ".log";
  const std::string cmd =
      absl::StrCat(osd_bytes > 0 ? absl::StrCat("KVC_CEPH_OSD_BYTES=", osd_bytes, " ") : "", "'",
                   source_dir, "/scripts/ceph-up.sh' '", dir, "' '", pool, "' >'", log, "' 2>&1");
  if (std::system(cmd.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("scripts/ceph-up.sh ", dir, " failed (its output: ",
                                               log, "; Ceph comes from scripts/install-deps.sh)"));
  }
  std::unique_ptr<LocalCeph> ceph(new LocalCeph(source_dir, dir, pool));
  for (const char* name : {"/mon.pid", "/osd.pid"}) {
    std::ifstream f(dir + name);
    int pid = 0;
    if (f >> pid && pid > 0) ceph->pids_.push_back(pid);
  }
  return ceph;
}

LocalCeph::~LocalCeph() {
  const std::string cmd =
      absl::StrCat("'", source_dir_, "/scripts/ceph-down.sh' '", dir_, "' >/dev/null 2>&1");
  (void)std::system(cmd.c_str());
  // The script ends nothing when the folder is gone: end what is still a Ceph daemon of ours.
  for (int pid : pids_) {
    std::ifstream cmdline(absl::StrCat("/proc/", pid, "/cmdline"));
    std::string argv0;
    std::getline(cmdline, argv0, '\0');
    if (argv0.find("ceph-") != std::string::npos) kill(pid, SIGKILL);
  }
}

}  // namespace kvc::serve
