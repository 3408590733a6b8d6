// The checkpoint folder's helpers that the tools' messages rest on
// (src/ckpt/checkpoint_dir.cpp): the tags found, in step order; what
// resolve_tag says when `latest` or a tag is missing, or when it is given a
// tag's own folder; and the safetensors writer leaving no temporary behind
// when a write fails (a file-size limit) or it is dropped before commit();
// the one-job-per-folder lock; a tag saved again or removed is never
// missing or half there at any moment (a failing rename() stands in for a
// kill between two renames).
#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "zero/ckpt/checkpoint_dir.h"
#include "zero/ckpt/safetensors.h"
#include "zero/ckpt/safetensors_reader.h"
#include "zero/ckpt/save_dir_lock.h"
#include "zero/core/error.h"

namespace ck = zero::ckpt;
namespace fs = std::filesystem;

// rename(2) as this process sees it (std::filesystem::rename calls it): while
// g_fail_renames_from is set, a rename whose source ends with it fails (EIO)
// as a process killed just before it would never do it.
static const char* g_fail_renames_from = nullptr;
static int g_moved_aside = 0;  // renames to a <tag>.replaced
extern "C" int rename(const char* from, const char* to) {
  using Fn = int (*)(const char*, const char*);
  static const Fn real = reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, "rename"));
  const std::string t = to;
  if (t.size() >= 9 && t.compare(t.size() - 9, 9, ".replaced") == 0) ++g_moved_aside;
  if (g_fail_renames_from) {
    const std::string f = from, suffix = g_fail_renames_from;
    if (f.size() >= suffix.size() && f.compare(f.size() - suffix.size(), suffix.size(), suffix) == 0) {
      errno = EIO;
      return -1;
    }
  }
  return real(from, to);
}
// renameat2(2): while g_no_exchange is set, RENAME_EXCHANGE is refused
// (EINVAL), as on a file system without it.
static bool g_no_exchange = false;
extern "C" int renameat2(int olddirfd, const char* from, int newdirfd, const char* to, unsigned int flags) {
  using Fn = int (*)(int, const char*, int, const char*, unsigned int);
  static const Fn real = reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, "renameat2"));
  if (g_no_exchange && (flags & RENAME_EXCHANGE) != 0) {
    errno = EINVAL;
    return -1;
  }
  return real(olddirfd, from, newdirfd, to, flags);
}
// unlink(2) likewise: while g_fail_unlinks_in is set, removing a file whose
// path holds it fails (EIO), as a removal killed half-way leaves the rest.
static const char* g_fail_unlinks_in = nullptr;
extern "C" int unlink(const char* path) {
  using Fn = int (*)(const char*);
  static const Fn real = reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, "unlink"));
  if (g_fail_unlinks_in && std::string(path).find(g_fail_unlinks_in) != std::string::npos) {
    errno = EIO;
    return -1;
  }
  return real(path);
}

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    static int n = 0;
    path = fs::temp_directory_path() / ("zero_ckpt_dir_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    ck::remove_tree(path, ec);
  }
};

void committed(const fs::path& dir, const std::string& tag) {
  fs::create_directories(dir / tag);
  std::ofstream(dir / tag / ck::kManifestName) << "{}";
}

std::string error_of(const fs::path& dir, const std::string& tag, const ck::TagWording& w = {}) {
  try {
    ck::resolve_tag(dir, tag, w);
  } catch (const zero::Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A file-size limit while it lives (SIGXFSZ ignored: a write past it fails
// with EFBIG), the old one back after.
struct FileSizeLimit {
  struct rlimit old {};
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = old;
    lim.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &lim);
  }
  ~FileSizeLimit() { setrlimit(RLIMIT_FSIZE, &old); }
};

TEST(CheckpointDir, ListsCommittedTagsInStepOrder) {
  TempDir d;
  for (const char* t : {"step-10", "step-2", "step-100", "best"}) committed(d.path, t);
  fs::create_directories(d.path / "step-200.partial");  // unfinished: not a tag
  fs::create_directories(d.path / "empty");             // no manifest: not a tag
  std::ofstream(d.path / ck::kLatestName) << "step-100\n";
  EXPECT_EQ(ck::list_tags(d.path), (std::vector<std::string>{"best", "step-2", "step-10", "step-100"}));
  EXPECT_TRUE(ck::list_tags(d.path / "nowhere").empty());
}

TEST(CheckpointDir, MissingLatestListsTheTagsAndNamesTheOption) {
  TempDir d;
  committed(d.path, "step-2");
  committed(d.path, "step-10");
  const std::string e = error_of(d.path, "latest", {"--resume", "start without --resume"});
  EXPECT_TRUE(has(e, "no 'latest' file in")) << e;
  EXPECT_TRUE(has(e, "holds step-2, step-10: give --resume step-10")) << e;
  EXPECT_FALSE(has(e, "no save there has finished")) << e;
  const std::string wrong = error_of(d.path, "step-99", {"--tag", ""});
  EXPECT_TRUE(has(wrong, "no checkpoint 'step-99'")) << wrong;
  EXPECT_TRUE(has(wrong, "give --tag step-10")) << wrong;
}

TEST(CheckpointDir, EmptyFolderSaysWhatToDo) {
  TempDir d;
  fs::create_directories(d.path / "step-4.partial");
  const std::string e = error_of(d.path, "latest", {"--resume", "start without --resume"});
  EXPECT_TRUE(has(e, "holds no finished checkpoint (only unfinished saves: step-4.partial): start without --resume"))
      << e;
}

std::string manifest_of(const fs::path& dir, const std::string& tag) {
  return ck::read_text(dir / ck::resolve_tag(dir, tag) / ck::kManifestName);
}

// With and without RENAME_EXCHANGE (the fallback moves the earlier save
// aside, and renames it back when the new one cannot follow).
class ATagSavedAgain : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    g_no_exchange = !GetParam();
    g_moved_aside = 0;
  }
  void TearDown() override { g_no_exchange = false; }
};

TEST_P(ATagSavedAgain, IsNeverMissing) {
  TempDir d;
  ck::prepare_partial(d.path, "step-8");
  ck::commit(d.path, "step-8", "{\"first\":1}");
  EXPECT_EQ(manifest_of(d.path, "latest"), "{\"first\":1}");
  // Saved again: the new save takes the name, and a failure at the point
  // where the new save would be renamed in (a kill there) leaves the
  // earlier one loadable under its name.
  ck::prepare_partial(d.path, "step-8");
  g_fail_renames_from = ".partial";
  std::string failed;
  try {
    ck::commit(d.path, "step-8", "{\"second\":2}");
  } catch (const zero::Error& e) {
    failed = e.what();
  }
  g_fail_renames_from = nullptr;
  const std::string now = manifest_of(d.path, "latest");
  EXPECT_TRUE(now == "{\"second\":2}" || (now == "{\"first\":1}" && !failed.empty())) << now << " / " << failed;
  EXPECT_EQ(ck::list_tags(d.path), std::vector<std::string>{"step-8"});
  // Whichever way it went, the next save of the tag is whole and leaves no
  // folder of the swap behind.
  ck::prepare_partial(d.path, "step-8");
  ck::commit(d.path, "step-8", "{\"third\":3}");
  EXPECT_EQ(manifest_of(d.path, "latest"), "{\"third\":3}");
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(d.path)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-8"}));
  // Where the exchange works, the earlier save is never moved aside (the
  // moment between two renames when the tag is missing never comes).
  if (GetParam()) {
    EXPECT_EQ(g_moved_aside, 0);
  }
  // A <tag>.replaced left by a save that stopped half-way is gone once the
  // tag is saved whole again.
  committed(d.path, "step-8.replaced");
  ck::prepare_partial(d.path, "step-8");
  ck::commit(d.path, "step-8", "{\"fourth\":4}");
  EXPECT_FALSE(fs::exists(d.path / "step-8.replaced"));
  EXPECT_EQ(manifest_of(d.path, "latest"), "{\"fourth\":4}");
}

INSTANTIATE_TEST_SUITE_P(Exchange, ATagSavedAgain, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? std::string("WithExchange") : std::string("WithoutExchange");
                         });

TEST(CheckpointDir, AnEarlierSaveMovedAsideIsNamedWithTheCommandThatRestoresIt) {
  // What a kill between the two renames leaves on a file system without
  // RENAME_EXCHANGE: latest names step-8, the earlier save is step-8.replaced.
  TempDir d;
  committed(d.path, "step-4");
  committed(d.path, "step-8.replaced");
  fs::create_directories(d.path / "step-8.partial");
  std::ofstream(d.path / ck::kLatestName) << "step-8\n";
  EXPECT_EQ(ck::list_tags(d.path), std::vector<std::string>{"step-4"});
  const std::string e = error_of(d.path, "latest", {"--resume", ""});
  EXPECT_TRUE(has(e, "the earlier 'step-8' is whole in " + (d.path / "step-8.replaced").string())) << e;
  EXPECT_TRUE(has(e, "mv " + (d.path / "step-8.replaced").string() + " " + (d.path / "step-8").string())) << e;
}

TEST(CheckpointDir, ARemovedTagIsHiddenBeforeItsFilesGo) {
  TempDir d;
  committed(d.path, "step-2");
  committed(d.path, "step-4");
  std::ofstream(d.path / "step-2" / "rank-00000-of-00001.bin") << "x";
  std::error_code ec;
  ck::remove_tag(d.path, "step-2", ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_FALSE(fs::exists(d.path / "step-2"));
  EXPECT_FALSE(fs::exists(d.path / "step-2.removing"));
  // A removal that stops half-way (no file of it can go): what is left is
  // not a tag, and the next removal of the name clears it.
  committed(d.path, "step-3");
  std::ofstream(d.path / "step-3" / "rank-00000-of-00001.bin") << "x";
  g_fail_unlinks_in = "step-3";
  ck::remove_tag(d.path, "step-3", ec);
  g_fail_unlinks_in = nullptr;
  EXPECT_TRUE(ec);
  EXPECT_EQ(ck::list_tags(d.path), std::vector<std::string>{"step-4"});
  EXPECT_TRUE(has(error_of(d.path, "step-3.removing"), "not a plain name")) << error_of(d.path, "step-3.removing");
  committed(d.path, "step-3");
  ck::remove_tag(d.path, "step-3", ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_EQ(ck::list_tags(d.path), std::vector<std::string>{"step-4"});
  EXPECT_FALSE(fs::exists(d.path / "step-3.removing"));
  // ... and a leftover of a name never removed again is swept (rotation
  // does it before it removes).
  committed(d.path, "step-1.removing");
  ck::sweep_removals(d.path);
  EXPECT_FALSE(fs::exists(d.path / "step-1.removing"));
  EXPECT_EQ(ck::list_tags(d.path), std::vector<std::string>{"step-4"});
}

TEST(CheckpointDir, ATagsOwnFolderNamesItsParentAndTag) {
  TempDir d;
  committed(d.path, "step-6");
  const std::string e = error_of(d.path / "step-6", "latest", {"--resume", ""});
  EXPECT_TRUE(has(e, "is one checkpoint")) << e;
  EXPECT_TRUE(has(e, "give its parent folder " + fs::weakly_canonical(d.path).string() + " and --resume step-6")) << e;
}

TEST(SafetensorsWriter, AFailedOrDroppedWriteLeavesNoTemporary) {
  TempDir d;
  const fs::path out = d.path / "m.safetensors";
  std::ofstream(out) << "earlier";
  {
    ck::SafetensorsWriter w(out, {{"x", "F32", {4}, 16}});
    const float v[4] = {1, 2, 3, 4};
    w.write(0, 0, v, sizeof v);
    w.sync();  // dropped before commit(): as if a later file failed
  }
  EXPECT_FALSE(fs::exists(out.string() + ".tmp"));
  // Past a file-size limit the constructor's reservation fails: it must
  // remove what it created.
  {
    const FileSizeLimit limit(4096);
    try {
      ck::SafetensorsWriter w(out, {{"x", "F32", {4096}, 4 * 4096}});
      ADD_FAILURE() << "a file past the size limit was reserved";
    } catch (const zero::Error& e) {
      EXPECT_TRUE(has(e.what(), "m.safetensors.tmp")) << e.what();
    }
  }
  EXPECT_FALSE(fs::exists(out.string() + ".tmp"));
  std::ifstream in(out);
  std::string s;
  in >> s;
  EXPECT_EQ(s, "earlier");
}

// The commit's last write, `latest`, failing (here: a folder in the way of
// its temporary): the checkpoint is in place and the error says so, with
// what `latest` still names and the tag to resume from.
TEST(CheckpointDir, ALatestThatCannotFollowNamesTheCommittedCheckpoint) {
  TempDir d;
  committed(d.path, "step-2");
  std::ofstream(d.path / ck::kLatestName) << "step-2\n";
  fs::create_directories(ck::partial_path(d.path, "step-4"));
  fs::create_directories(d.path / "latest.tmp");
  try {
    ck::commit(d.path, "step-4", "{}");
    ADD_FAILURE() << "the commit did not report the latest it could not write";
  } catch (const zero::Error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(has(m, "checkpoint 'step-4' is complete in " + (d.path / "step-4").string())) << m;
    EXPECT_TRUE(has(m, "it still names 'step-2'")) << m;
    EXPECT_TRUE(has(m, "(--resume step-4)")) << m;
    EXPECT_FALSE(has(m, "previous checkpoint is untouched")) << m;
  }
  EXPECT_TRUE(fs::exists(d.path / "step-4" / ck::kManifestName));
  std::ifstream in(d.path / ck::kLatestName);
  std::string latest;
  in >> latest;
  EXPECT_EQ(latest, "step-2");
}

// A text file whose write fails (past a file-size limit) leaves no temporary.
TEST(CheckpointDir, AFailedTextWriteLeavesNoTemporary) {
  TempDir d;
  {
    const FileSizeLimit limit(4096);
    EXPECT_THROW(ck::write_text_atomic(d.path / "big.json", std::string(3 * 4096, 'x')), zero::Error);
  }
  EXPECT_FALSE(fs::exists(d.path / "big.json.tmp"));
  EXPECT_FALSE(fs::exists(d.path / "big.json"));
}

// A second holder of a folder's lock is refused, naming the first (its pid
// and host) and the option; once the first is gone, the folder is free
// again though the lock file stays, and a tag list does not see it.
TEST(SaveDirLock, OneJobPerFolder) {
  TempDir d;
  committed(d.path, "step-2");
  std::string second;
  {
    ck::SaveDirLock first(d.path, "--save-dir");
    try {
      ck::SaveDirLock again(d.path, "--save-dir");
      ADD_FAILURE() << "a second lock of one folder was granted";
    } catch (const zero::Error& e) {
      second = e.what();
    }
  }
  EXPECT_NE(second.find("--save-dir " + d.path.string() + " is in use by another running job (pid " +
                        std::to_string(::getpid()) + " on "),
            std::string::npos)
      << second;
  EXPECT_NE(second.find("Give this job another --save-dir"), std::string::npos) << second;
  EXPECT_TRUE(fs::exists(d.path / ck::kSaveDirLockName));
  EXPECT_NO_THROW(ck::SaveDirLock later(d.path, "--save-dir"));
  const ck::SaveDirLock third(d.path, "--save-dir");
  EXPECT_TRUE(third.warning().empty()) << third.warning();
  EXPECT_EQ(ck::list_tags(d.path), std::vector<std::string>{"step-2"});
}

// A folder whose lock file cannot be made (here a folder in its place; a
// full disk, a filesystem without flock alike) is not refused: the lock
// says why it does not hold, for the caller to warn.
TEST(SaveDirLock, AFolderThatCannotBeLockedIsAWarning) {
  TempDir d;
  fs::create_directories(d.path / ck::kSaveDirLockName);
  const ck::SaveDirLock lock(d.path, "--save-dir");
  EXPECT_TRUE(has(lock.warning(), "--save-dir " + d.path.string() + " is not locked against a second job (cannot create"))
      << lock.warning();
  const ck::SaveDirLock second(d.path, "--save-dir");  // no lock, no refusal
  EXPECT_FALSE(second.warning().empty());
}

// A link in the lock's place is not followed, and the error says so.
TEST(SaveDirLock, ALinkInItsPlaceIsRefused) {
  TempDir d;
  fs::create_symlink(d.path / "elsewhere", d.path / ck::kSaveDirLockName);
  try {
    ck::SaveDirLock lock(d.path, "--save-dir");
    ADD_FAILURE() << "a lock through a symbolic link";
  } catch (const zero::Error& e) {
    EXPECT_NE(std::string(e.what()).find("symbolic link"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(d.path / "elsewhere"));
}

// What the writer wrote, the reader reads back: names, dtypes, shapes, the
// bytes of each entry and the metadata, whatever the header's key order.
TEST(SafetensorsReader, ReadsBackWhatTheWriterWrote) {
  TempDir d;
  const fs::path out = d.path / "w.safetensors";
  {
    ck::SafetensorsWriter w(out, {{"z.weight", "F32", {2, 3}, 24}, {"a.bias", "BF16", {3}, 6}, {"e", "F32", {0}, 0}},
                            {{"format", "pt"}});
    const float z[6] = {1, 2, 3, 4, 5, 6};
    const std::uint16_t a[3] = {0x3f80, 0x4000, 0xc040};
    w.write(0, 0, z, sizeof z);
    w.write(1, 0, a, sizeof a);
    w.finish();
  }
  const ck::SafetensorsReader r(out);
  ASSERT_EQ(r.entries().size(), 3u);
  EXPECT_EQ(r.entries()[0].name, "z.weight");  // the data's order
  EXPECT_EQ(r.metadata().at("format"), "pt");
  const ck::SafetensorsEntry* z = r.find("z.weight");
  ASSERT_NE(z, nullptr);
  EXPECT_EQ(z->dtype, "F32");
  EXPECT_EQ(z->shape, (std::vector<std::int64_t>{2, 3}));
  float zv[6];
  r.read(*z, zv);
  EXPECT_EQ(zv[5], 6.0f);
  std::uint16_t av[3];
  r.read(*r.find("a.bias"), av);
  EXPECT_EQ(av[2], 0xc040);
  EXPECT_EQ(r.find("e")->bytes, 0u);
  EXPECT_EQ(r.find("nothing"), nullptr);
}

// A file that is not one, or lies about its sizes, is refused at open with
// the file and the reason named; nothing is read past its end.
TEST(SafetensorsReader, DamagedHeadersAreNamed) {
  TempDir d;
  auto file = [&](const std::string& header, std::size_t data_bytes, bool give_length = true) {
    const fs::path p = d.path / "bad.safetensors";
    std::ofstream o(p, std::ios::binary | std::ios::trunc);
    if (give_length) {
      std::uint64_t n = header.size();
      for (int i = 0; i < 8; ++i) o.put(static_cast<char>(n >> (8 * i)));
    }
    o << header << std::string(data_bytes, '\0');
    return p;
  };
  auto refused = [&](const fs::path& p) -> std::string {
    try {
      ck::SafetensorsReader r(p);
    } catch (const zero::Error& e) {
      return e.what();
    }
    return "(accepted)";
  };
  EXPECT_TRUE(has(refused(file("abc", 0, false)), "shorter than its 8-byte header length"));
  EXPECT_TRUE(has(refused(file("[1, 2]", 0)), "its header is not a JSON object"));
  EXPECT_TRUE(has(refused(file("{not json", 0)), "its header is not a JSON object"));
  EXPECT_TRUE(has(refused(file(R"({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8)),
                  "'x''s data [0, 16) is past the 8 bytes of data"));
  EXPECT_TRUE(has(refused(file(R"({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})", 16)),
                  "'x' holds 16 bytes, its shape and dtype 12"));
  EXPECT_TRUE(has(refused(file(R"({"x": {"dtype": "Q4", "shape": [3], "data_offsets": [0, 3]}})", 3)),
                  "dtype 'Q4', which zerocpp does not know"));
  EXPECT_TRUE(has(refused(file(R"({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4)),
                  "'x''s shape holds -1"));
  EXPECT_TRUE(has(refused(file(R"({"x": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})", 4)),
                  "'x''s shape is too large"));
  EXPECT_TRUE(has(refused(file(R"({"x": {"dtype": "F32", "shape": [1]}})", 4)), "lacks dtype, shape or data_offsets"));
  EXPECT_TRUE(has(refused(file(R"({"x": {"dtype": "F32", "shape": [[[1]]], "data_offsets": [0, 4]}})", 4)),
                  "'x''s shape holds an array"));
  // The entries must tile the data: no overlap, no gap, no bytes after.
  EXPECT_TRUE(has(refused(file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                   "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 4)),
                  "starts at data byte 0, not where the one before it ends (4): its data overlaps"));
  EXPECT_TRUE(has(refused(file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8)),
                  "'a' starts at data byte 4, not where the one before it ends (0)"));
  EXPECT_TRUE(has(refused(file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 8)),
                  "the file holds bytes no tensor owns"));
  // A header length past the file.
  const fs::path p = d.path / "long.safetensors";
  {
    std::ofstream o(p, std::ios::binary);
    const std::uint64_t n = 1000;
    for (int i = 0; i < 8; ++i) o.put(static_cast<char>(n >> (8 * i)));
    o << "{}";
  }
  const std::string said = refused(p);
  EXPECT_TRUE(has(said, "long.safetensors is not a safetensors file (its header length 1000 is past the file's 10 bytes)"))
      << said;
  EXPECT_TRUE(has(refused(d.path / "none.safetensors"), "cannot open"));
}

}  // namespace
