#include "core/state_dict.h"

#include "gtest/gtest.h"

namespace dcp {
namespace {

StateDict Nested() {
  StateDict optim_state;
  optim_state["0"] = StateDict{{"exp_avg", Tensor::Empty(DType::kF32, {2})},
                               {"step", int64_t{7}}};
  StateDict sd;
  sd["model"] = StateDict{{"w", Tensor::Empty(DType::kBF16, {3, 3})}};
  sd["optim"] = StateDict{
      {"state", optim_state},
      {"param_groups", StateList{StateDict{{"lr", 0.1}, {"name", "g0"}}}}};
  sd["epoch"] = 3;
  sd["blob"] = Bytes{std::string("\0\1\2", 3)};
  return sd;
}

int64_t StepOf(const StateDict& sd) {
  return sd.at("optim")
      .dict()
      .at("state")
      .dict()
      .at("0")
      .dict()
      .at("step")
      .int_value();
}

TEST(FlattenStateDict, DottedNamesAndPaths) {
  absl::StatusOr<FlatStateDict> flat = FlattenStateDict(Nested());
  ASSERT_TRUE(flat.ok()) << flat.status();
  std::vector<std::string> names;
  for (const auto& [name, value] : flat->leaves) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "blob", "epoch", "model.w", "optim.param_groups.0.lr",
                       "optim.param_groups.0.name", "optim.state.0.exp_avg",
                       "optim.state.0.step"}));
  const ObjectPath& path = flat->mapping.at("optim.param_groups.0.lr");
  ASSERT_EQ(path.size(), 4u);
  EXPECT_EQ(std::get<int64_t>(path[2]), 0);
  EXPECT_EQ(std::get<std::string>(path[3]), "lr");
}

TEST(FlattenStateDict, RoundTripRestoresNesting) {
  StateDict original = Nested();
  absl::StatusOr<FlatStateDict> flat = FlattenStateDict(original);
  ASSERT_TRUE(flat.ok());
  absl::StatusOr<StateDict> back =
      UnflattenStateDict(flat->leaves, flat->mapping);
  ASSERT_TRUE(back.ok()) << back.status();
  const StateValue& groups = back->at("optim").dict().at("param_groups");
  ASSERT_EQ(groups.kind(), StateValue::Kind::kList);
  EXPECT_DOUBLE_EQ(groups.list()[0].dict().at("lr").double_value(), 0.1);
  EXPECT_EQ(back->at("blob").bytes_value().data, std::string("\0\1\2", 3));
  EXPECT_EQ(StepOf(*back), 7);
}

TEST(FlattenStateDict, DottedKeyCollisionIsAnError) {
  StateDict sd;
  sd["a.b"] = 1;
  sd["a"] = StateDict{{"b", 2}};
  for (const absl::Status& s :
       {FlattenStateDict(sd).status(), FlattenStateDictInPlace(sd).status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("\"a.b\""), absl::string_view::npos);
  }
}

// List indices flatten in numeric order, which is not name order ("l.10"
// sorts before "l.2"): the leaves still come out sorted, and a collision
// with a name inserted out of order is still found.
TEST(FlattenStateDict, NamesOutOfOrderAndTheirCollisions) {
  StateList list;
  for (int i = 0; i < 12; ++i) list.push_back(StateValue(int64_t{i}));
  StateDict sd;
  sd["l"] = list;
  absl::StatusOr<FlatStateDict> flat = FlattenStateDict(sd);
  ASSERT_TRUE(flat.ok()) << flat.status();
  ASSERT_EQ(flat->leaves.size(), 12u);
  EXPECT_EQ(flat->leaves.begin()->first, "l.0");
  EXPECT_EQ(std::next(flat->leaves.begin(), 2)->first, "l.10");
  EXPECT_EQ(flat->leaves.at("l.10").int_value(), 10);
  EXPECT_EQ(std::get<int64_t>(flat->mapping.at("l.2")[1]), 2);
  sd["l.10"] = 5;  // Flattened after "l.11".
  absl::Status status = FlattenStateDict(sd).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("\"l.10\""), absl::string_view::npos);
}

// An empty key is an element like any other: {"": {"w": ...}} is ".w"
// (as torch names it), apart from a top-level "w".
TEST(FlattenStateDict, AnEmptyKeyKeepsItsDot) {
  StateDict sd;
  sd[""] = StateDict{{"w", 1}, {"", 2}};
  sd["w"] = 3;
  absl::StatusOr<FlatStateDict> flat = FlattenStateDict(sd);
  ASSERT_TRUE(flat.ok()) << flat.status();
  std::vector<std::string> names;
  for (const auto& [name, value] : flat->leaves) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{".", ".w", "w"}));
  EXPECT_EQ(PathToString({std::string(""), int64_t{0}}), ".0");
  EXPECT_EQ(PathToString({std::string("")}), "");
}

TEST(FlattenStateDict, DottedKeyWithoutCollisionRoundTrips) {
  StateDict sd;
  sd["layer.0"] = StateDict{{"w", 5}};
  absl::StatusOr<FlatStateDict> flat = FlattenStateDict(sd);
  ASSERT_TRUE(flat.ok());
  absl::StatusOr<StateDict> back =
      UnflattenStateDict(flat->leaves, flat->mapping);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->at("layer.0").dict().at("w").int_value(), 5);
}

TEST(FlattenStateDictInPlace, SameNamesAsFlattenPointingIntoTheDict) {
  StateDict sd = Nested();
  // List indices past 9 sort as strings, as in FlattenStateDict.
  StateList many;
  for (int i = 0; i < 12; ++i) many.push_back(i);
  sd["many"] = many;
  absl::StatusOr<FlatStateDict> flat = FlattenStateDict(sd);
  ASSERT_TRUE(flat.ok()) << flat.status();
  absl::StatusOr<std::vector<std::pair<std::string, StateValue*>>> refs =
      FlattenStateDictInPlace(sd);
  ASSERT_TRUE(refs.ok()) << refs.status();
  std::vector<std::string> want;
  for (const auto& [name, value] : flat->leaves) want.push_back(name);
  std::vector<std::string> got;
  for (const auto& [name, value] : *refs) {
    got.push_back(name);
    EXPECT_EQ(value, FindByPath(sd, flat->mapping.at(name))) << name;
  }
  EXPECT_EQ(got, want);
  // Assigning through a pointer changes the state dict itself.
  for (auto& [name, value] : *refs) {
    if (name == "optim.state.0.step") *value = int64_t{8};
  }
  EXPECT_EQ(StepOf(sd), 8);
}

TEST(FindByPath, FindsLeavesAndRejectsMissing) {
  StateDict sd = Nested();
  StateValue* v =
      FindByPath(sd, {std::string("optim"), std::string("param_groups"),
                      int64_t{0}, std::string("name")});
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->string_value(), "g0");
  EXPECT_EQ(FindByPath(sd, {std::string("optim"), int64_t{0}}), nullptr);
  EXPECT_EQ(FindByPath(sd, {std::string("nope")}), nullptr);
}

}  // namespace
}  // namespace dcp
