// --tenant-quota parsing: what each tenant may keep, "*" for the rest, and a clear error
// naming the item for every malformed one.
#include "cachesvc/tenant_quotas.h"

#include "gtest/gtest.h"

namespace kvc::cachesvc {
namespace {

TEST(TenantQuotasTest, NamedTenantsAndEveryoneElse) {
  absl::StatusOr<TenantQuotas> q =
      TenantQuotas::Parse({"acme:ram=4G,ssd=100G,pins=1000,rados=2T", "*:ssd=10M", "globex:pins=7",
                           "initrode:rados=500G"});
  ASSERT_TRUE(q.ok()) << q.status();
  const std::optional<storage::Quota> acme = q->For("acme");
  ASSERT_TRUE(acme.has_value());
  EXPECT_EQ(acme->owner, "tenant acme");
  EXPECT_EQ(acme->ram_bytes, 4ull << 30);
  EXPECT_EQ(acme->ssd_bytes, 100ull << 30);
  EXPECT_EQ(acme->pinned_chunks, 1000u);
  EXPECT_EQ(acme->rados_bytes, 2ull << 40);
  const std::optional<storage::Quota> initrode = q->For("initrode");
  ASSERT_TRUE(initrode.has_value());  // a RADOS limit alone is a quota
  EXPECT_EQ(initrode->rados_bytes, 500ull << 30);
  EXPECT_EQ(initrode->ssd_bytes, 0u);
  const std::optional<storage::Quota> globex = q->For("globex");
  ASSERT_TRUE(globex.has_value());
  EXPECT_EQ(globex->ssd_bytes, 0u);  // named: "*" does not add to it
  EXPECT_EQ(globex->pinned_chunks, 7u);
  const std::optional<storage::Quota> other = q->For("initech");
  ASSERT_TRUE(other.has_value());
  EXPECT_EQ(other->owner, "tenant initech");
  EXPECT_EQ(other->ssd_bytes, 10ull << 20);
  EXPECT_FALSE(q->empty());

  absl::StatusOr<TenantQuotas> none = TenantQuotas::Parse({});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  EXPECT_FALSE(none->For("acme").has_value());
}

TEST(TenantQuotasTest, MalformedItemsAreNamed) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"ram=4G"}, "names no tenant"},
      {{":ram=4G"}, "names no tenant"},
      {{"acme:disk=4G"}, "unknown limit 'disk'"},
      {{"acme:ram=4X"}, "'acme:ram=4X': the size must be a positive number"},
      {{"acme:ram=0"}, "the size must be a positive number"},
      {{"acme:pins=-1"}, "pins must be a positive number"},
      {{"acme:"}, "sets no limit"},
      {{"acme:ram=1G", "acme:ssd=1G"}, "names tenant 'acme' twice"},
      {{"*:ram=1G", "*:ssd=1G"}, "names tenant '*' twice"},
  };
  for (const auto& [flags, text] : cases) {
    absl::StatusOr<TenantQuotas> q = TenantQuotas::Parse(flags);
    ASSERT_FALSE(q.ok()) << flags[0];
    EXPECT_TRUE(absl::IsInvalidArgument(q.status()));
    EXPECT_NE(q.status().message().find(text), std::string::npos) << q.status();
    EXPECT_NE(q.status().message().find("--tenant-quota"), std::string::npos) << q.status();
  }
}

}  // namespace
}  // namespace kvc::cachesvc
