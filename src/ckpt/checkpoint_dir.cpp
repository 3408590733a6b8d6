#include "zero/ckpt/checkpoint_dir.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>

#include "zero/ckpt/manifest.h"
#include "zero/core/error.h"

namespace zero::ckpt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPartial = ".partial";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

[[noreturn]] void fs_fail(const std::string& what, const fs::path& p, const std::error_code& ec) {
  throw Error(zero::detail::str_cat(what, " ", p.string(), ": ", ec.message(),
                                    "; make the folder writable, free space, or save somewhere else (--save-dir). "
                                    "The previous checkpoint is untouched"));
}

}  // namespace

void check_tag(const std::string& tag) {
  ZERO_CHECK(is_plain_file_name(tag) && tag != kLatestName && !ends_with(tag, kPartial) && !ends_with(tag, ".replaced"),
             "checkpoint tag '", tag, "' is not a plain name: use letters, digits, '.', '_' and '-' (such as "
             "step-1000), not starting with '.', not 'latest' or ending in .partial");
}

fs::path partial_path(const fs::path& dir, const std::string& tag) { return dir / (tag + kPartial); }

std::string shard_file_name(int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof name, "rank-%05d-of-%05d.bin", rank, world);
  return name;
}

namespace {
int remove_one(const char* path, const struct stat*, int type, struct FTW*) {
  return type == FTW_DP ? ::rmdir(path) : ::unlink(path);
}
}  // namespace

void remove_tree(const fs::path& path, std::error_code& ec) {
  ec.clear();
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) ec = std::error_code(errno, std::generic_category());
    return;
  }
  if (::nftw(path.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0) ec = std::error_code(errno, std::generic_category());
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const int e = errno;
  ZERO_CHECK(fd >= 0, "cannot open folder ", dir.string(), " to fsync it: ", std::strerror(e));
  const int rc = ::fsync(fd);
  const int e2 = errno;
  ::close(fd);
  ZERO_CHECK(rc == 0, "fsync of folder ", dir.string(), " failed: ", std::strerror(e2));
}

void prepare_partial(const fs::path& dir, const std::string& tag) {
  check_tag(tag);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fs_fail("cannot create the checkpoint folder", dir, ec);
  const fs::path partial = partial_path(dir, tag);
  remove_tree(partial, ec);
  if (ec) fs_fail("cannot remove the unfinished save", partial, ec);
  fs::create_directory(partial, ec);
  if (ec) fs_fail("cannot create", partial, ec);
}

void write_text_atomic(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int e = errno;
  ZERO_CHECK(fd >= 0, "cannot create ", tmp.string(), ": ", std::strerror(e),
             "; make the folder writable or save somewhere else (--save-dir)");
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int we = errno;
      ::close(fd);
      ZERO_CHECK(false, "writing ", tmp.string(), " failed: ", std::strerror(we),
                 "; free space or save somewhere else (--save-dir). The previous checkpoint is untouched");
    }
    done += static_cast<std::size_t>(w);
  }
  const int rc = ::fsync(fd);
  const int fe = errno;
  ::close(fd);
  ZERO_CHECK(rc == 0, "fsync of ", tmp.string(), " failed: ", std::strerror(fe));
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fs_fail("cannot rename into place", path, ec);
  fsync_dir(path.parent_path().empty() ? fs::path(".") : path.parent_path());
}

void commit(const fs::path& dir, const std::string& tag, const std::string& manifest_json) {
  const fs::path partial = partial_path(dir, tag), final_dir = dir / tag;
  write_text_atomic(partial / kManifestName, manifest_json);
  std::error_code ec;
  const fs::path replaced = dir / (tag + ".replaced");
  const bool existed = fs::exists(final_dir, ec);
  if (existed) {
    remove_tree(replaced, ec);
    fs::rename(final_dir, replaced, ec);
    if (ec) fs_fail("cannot move the earlier checkpoint of the same tag aside", final_dir, ec);
  }
  fs::rename(partial, final_dir, ec);
  if (ec) fs_fail("cannot rename the finished save into place", final_dir, ec);
  fsync_dir(dir);
  write_text_atomic(dir / kLatestName, tag + "\n");
  if (existed) remove_tree(replaced, ec);  // best effort: a leftover is harmless
}

std::string read_text(const fs::path& path, std::size_t max_bytes) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  ZERO_CHECK(!ec, "cannot read ", path.string(), ": ", ec.message());
  ZERO_CHECK(size <= max_bytes, path.string(), " has ", size, " bytes, more than the ", max_bytes,
             " a checkpoint's text files may have: it is not a zerocpp checkpoint file");
  std::ifstream in(path, std::ios::binary);
  ZERO_CHECK(in.good(), "cannot open ", path.string());
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::string resolve_tag(const fs::path& dir, const std::string& tag) {
  std::error_code ec;
  ZERO_CHECK(fs::is_directory(dir, ec), "no checkpoint folder ", dir.string(),
             ": give the folder the checkpoints were saved to (--save-dir)");
  std::string t = tag;
  if (tag == kLatestName) {
    const fs::path latest = dir / kLatestName;
    ZERO_CHECK(fs::exists(latest, ec), "no checkpoint in ", dir.string(), " (no '", kLatestName,
               "' file): no save there has finished yet. Start without --resume, or give a tag");
    t = read_text(latest, 4096);
    while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ')) t.pop_back();
    ZERO_CHECK(is_plain_file_name(t), dir.string(), "/", kLatestName, " names '", t,
               "', which is not a checkpoint tag: the file is damaged; give a tag instead of latest");
  } else {
    check_tag(tag);
  }
  const fs::path manifest = dir / t / kManifestName;
  if (!fs::exists(manifest, ec)) {
    const bool partial = fs::exists(partial_path(dir, t), ec);
    ZERO_CHECK(false, "no checkpoint '", t, "' in ", dir.string(), " (", manifest.string(), " is missing)",
               partial ? ": its save did not finish (only " + t + ".partial exists); load an earlier tag" : "");
  }
  return t;
}

}  // namespace zero::ckpt
