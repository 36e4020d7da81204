#include "cachesvc/tenant_quotas.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"

namespace kvc::cachesvc {

std::string SharedAccountOf(const std::string& tenant) { return "tenant " + tenant; }

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view flag, absl::string_view item,
                                       absl::string_view text) {
  uint64_t scale = 1;
  if (!text.empty()) {
    switch (absl::ascii_toupper(text.back())) {
      case 'K':
        scale = 1ull << 10;
        break;
      case 'M':
        scale = 1ull << 20;
        break;
      case 'G':
        scale = 1ull << 30;
        break;
      case 'T':
        scale = 1ull << 40;
        break;
      default:
        break;
    }
    if (scale != 1) text.remove_suffix(1);
  }
  uint64_t n = 0;
  if (!absl::SimpleAtoi(text, &n) || n == 0 || n > UINT64_MAX / scale) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " item '", item, "': the size must be a positive number of bytes"));
  }
  return n * scale;
}

absl::StatusOr<TenantQuotas> TenantQuotas::Parse(const std::vector<std::string>& flags) {
  constexpr absl::string_view kFlag = "--tenant-quota";
  TenantQuotas q;
  for (const std::string& item : flags) {
    const size_t colon = item.rfind(':');
    const std::string tenant(absl::StripAsciiWhitespace(absl::string_view(item).substr(0, colon)));
    if (colon == std::string::npos || tenant.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(kFlag, " '", item, "' names no tenant (TENANT:ram=4G,ssd=100G,pins=N)"));
    }
    if (tenant == "*" ? q.others_.has_value() : q.named_.contains(tenant)) {
      return absl::InvalidArgumentError(absl::StrCat(kFlag, " names tenant '", tenant, "' twice"));
    }
    storage::Quota quota;
    quota.owner = tenant == "*" ? "a tenant" : SharedAccountOf(tenant);
    for (absl::string_view limit :
         absl::StrSplit(absl::string_view(item).substr(colon + 1), ',', absl::SkipEmpty())) {
      std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(limit, '=');
      const absl::string_view kind = absl::StripAsciiWhitespace(kv.first);
      const absl::string_view value = absl::StripAsciiWhitespace(kv.second);
      if (kind == "ram" || kind == "ssd" || kind == "rados") {
        KVC_ASSIGN_OR_RETURN(uint64_t bytes, ParseByteSize(kFlag, item, value));
        (kind == "ram"   ? quota.ram_bytes
         : kind == "ssd" ? quota.ssd_bytes
                         : quota.rados_bytes) = bytes;
      } else if (kind == "pins") {
        if (!absl::SimpleAtoi(value, &quota.pinned_chunks) || quota.pinned_chunks == 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(kFlag, " '", item, "': pins must be a positive number of chunks"));
        }
      } else {
        return absl::InvalidArgumentError(absl::StrCat(kFlag, " '", item, "': unknown limit '",
                                                       kind, "' (ram, ssd, rados or pins)"));
      }
    }
    if (quota.ram_bytes == 0 && quota.ssd_bytes == 0 && quota.rados_bytes == 0 &&
        quota.pinned_chunks == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          kFlag, " '", item, "' sets no limit (ram=BYTES, ssd=BYTES, rados=BYTES or pins=N)"));
    }
    if (tenant == "*") {
      q.others_ = quota;
    } else {
      q.named_[tenant] = quota;
    }
  }
  return q;
}

std::optional<storage::Quota> TenantQuotas::For(const std::string& tenant) const {
  std::optional<storage::Quota> q;
  if (auto it = named_.find(tenant); it != named_.end()) {
    q = it->second;
  } else if (others_) {
    q = *others_;
    q->owner = SharedAccountOf(tenant);
  } else if (default_pins_ > 0) {
    q = storage::Quota{SharedAccountOf(tenant), 0, 0, 0, 0};
  }
  if (q && q->pinned_chunks == 0) q->pinned_chunks = default_pins_;
  return q;
}

absl::Status TenantQuotas::CheckNamedFit(const storage::ChunkStore::QuotaRoom& room) const {
  uint64_t ram = 0, ssd = 0;
  for (const auto& [tenant, q] : named_) {
    ram += q.ram_bytes;
    ssd += q.ssd_bytes;
  }
  auto check = [](const char* tier, uint64_t sum, uint64_t cap) {
    if (sum <= cap) return absl::OkStatus();
    return absl::ResourceExhaustedError(absl::StrCat(
        "--tenant-quota: the named tenants' ", tier, " quotas add up to ", sum, " bytes; the ",
        tier, " tier holds ", cap,
        " bytes for quotas (each chunk is charged the whole slot it takes); lower them or "
        "give the tier more room"));
  };
  KVC_RETURN_IF_ERROR(check("RAM", ram, room.ram_bytes));
  return check("SSD", ssd, room.ssd_bytes);
}

}  // namespace kvc::cachesvc
