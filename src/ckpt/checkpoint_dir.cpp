#include "zero/ckpt/checkpoint_dir.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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

constexpr const char* kReplaced = ".replaced";  // an earlier save of a tag, moved aside (no RENAME_EXCHANGE)
constexpr const char* kRemoving = ".removing";  // a tag being removed (hidden first, then deleted)

// Names that are never tags: a save in progress, a save moved aside, one
// being removed.
bool internal_name(const std::string& name) {
  return ends_with(name, kPartial) || ends_with(name, kReplaced) || ends_with(name, kRemoving);
}

[[noreturn]] void fs_fail(const std::string& what, const fs::path& p, const std::error_code& ec) {
  throw Error(zero::detail::str_cat(what, " ", p.string(), ": ", ec.message(),
                                    "; make the folder writable, free space, or save somewhere else (zero-train: --save-dir). "
                                    "The previous checkpoint is untouched"));
}

}  // namespace

void check_tag(const std::string& tag) {
  ZERO_CHECK(is_plain_file_name(tag) && tag != kLatestName && !internal_name(tag),
             "checkpoint tag '", tag, "' is not a plain name: use letters, digits, '.', '_' and '-' (such as "
             "step-1000), not starting with '.', not 'latest' or ending in .partial, .replaced or .removing");
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

void sweep_removals(const fs::path& dir) {
  std::error_code ec;
  std::vector<fs::path> left;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (ends_with(it->path().filename().string(), kRemoving)) left.push_back(it->path());
  }
  for (const fs::path& p : left) {
    std::error_code e2;
    remove_tree(p, e2);
  }
}

void remove_tag(const fs::path& dir, const std::string& tag, std::error_code& ec) {
  // Hidden first (one rename: list_tags skips the name), then deleted file
  // by file: a kill mid-way never leaves a tag that lists but cannot load.
  const fs::path removing = dir / (tag + kRemoving);
  remove_tree(removing, ec);
  if (ec) return;
  fs::rename(dir / tag, removing, ec);
  if (ec) return;
  remove_tree(removing, ec);
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
             "; make the folder writable or save somewhere else (zero-train: --save-dir)");
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int we = errno;
      ::close(fd);
      ::unlink(tmp.c_str());  // (a full disk: nothing of it left behind)
      ZERO_CHECK(false, "writing ", tmp.string(), " failed: ", std::strerror(we),
                 "; free space or save somewhere else (zero-train: --save-dir)");
    }
    done += static_cast<std::size_t>(w);
  }
  const int rc = ::fsync(fd);
  const int fe = errno;
  ::close(fd);
  if (rc != 0) ::unlink(tmp.c_str());
  ZERO_CHECK(rc == 0, "fsync of ", tmp.string(), " failed: ", std::strerror(fe));
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fs_fail("cannot rename into place", path, ec);
  fsync_dir(path.parent_path().empty() ? fs::path(".") : path.parent_path());
}

void commit(const fs::path& dir, const std::string& tag, const std::string& manifest_json) {
  const fs::path partial = partial_path(dir, tag), final_dir = dir / tag;
  try {
    write_text_atomic(partial / kManifestName, manifest_json);
  } catch (const Error& e) {
    throw Error(detail::str_cat(e.what(), ". The previous checkpoint is untouched"));
  }
  std::error_code ec;
  const bool existed = fs::exists(final_dir, ec);
  const fs::path replaced = dir / (tag + kReplaced);
  if (existed) {
    // The earlier save of this tag and the new one swap names in one step:
    // at no moment is the tag missing (a kill between two renames would
    // leave `latest` naming nothing). The partial name then holds the
    // earlier save, removed below (or by the next save of the tag).
    if (::renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
      fsync_dir(dir);
      remove_tree(partial, ec);  // best effort: a leftover .partial is harmless
    } else {
      // No exchange here (a file system without it, a sandbox that refuses
      // renameat2): move the earlier one aside. A crash between the renames
      // leaves it whole as <tag>.replaced, which a load names (resolve_tag).
      remove_tree(replaced, ec);
      fs::rename(final_dir, replaced, ec);
      if (ec) fs_fail("cannot move the earlier checkpoint of the same tag aside", final_dir, ec);
      fs::rename(partial, final_dir, ec);
      if (ec) {
        std::error_code back;
        fs::rename(replaced, final_dir, back);  // the earlier one under its name again
        if (back) {
          throw Error(zero::detail::str_cat("cannot rename the finished save into place ", final_dir.string(), ": ",
                                            ec.message(), "; the earlier '", tag, "' is whole in ",
                                            replaced.string(), ": rename it back (mv ", replaced.string(), " ",
                                            final_dir.string(), ")"));
        }
        fs_fail("cannot rename the finished save into place", final_dir, ec);
      }
      fsync_dir(dir);
    }
  } else {
    fs::rename(partial, final_dir, ec);
    if (ec) fs_fail("cannot rename the finished save into place", final_dir, ec);
    fsync_dir(dir);
  }
  // (A <tag>.replaced of an earlier save that stopped half-way is stale
  // once the tag is whole again.)
  remove_tree(replaced, ec);  // best effort: a leftover is harmless
  // The checkpoint is in place: a `latest` that cannot follow says so, and
  // what it still names (the write leaves it whole, old or new).
  try {
    write_text_atomic(dir / kLatestName, tag + "\n");
  } catch (const Error& e) {
    std::string before = "nothing (no latest file)";
    std::ifstream in(dir / kLatestName);
    if (std::string t; std::getline(in, t)) before = "'" + t + "'";
    throw Error(detail::str_cat(committed_without_latest(tag), final_dir.string(), ", but ",
                                (dir / kLatestName).string(), " could not name it (", e.what(), "); it still names ",
                                before, ". Free space, and resume from this one with its tag (--resume ", tag, ")"));
  }
}

std::string committed_without_latest(const std::string& tag) { return "checkpoint '" + tag + "' is complete in "; }

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

namespace {

// step-2 before step-10: names compared with their trailing numbers as numbers.
bool step_order(const std::string& a, const std::string& b) {
  auto split = [](const std::string& s) {
    std::size_t i = s.size();
    while (i > 0 && s[i - 1] >= '0' && s[i - 1] <= '9') --i;
    return std::make_pair(s.substr(0, i), s.substr(i));
  };
  const auto [pa, na] = split(a);
  const auto [pb, nb] = split(b);
  if (pa != pb) return pa < pb;
  if (na.size() != nb.size()) return na.size() < nb.size();  // no leading zeros in step-<N>
  return na < nb;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The unfinished saves in dir (<tag>.partial folders), for the messages.
std::vector<std::string> list_partials(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (ends_with(name, kPartial)) out.push_back(name);
  }
  std::sort(out.begin(), out.end(), step_order);
  return out;
}

}  // namespace

std::vector<std::string> list_tags(const fs::path& dir) {
  std::vector<std::string> tags;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code e2;
    if (name == kLatestName || !is_plain_file_name(name) || internal_name(name) ||
        !fs::exists(it->path() / kManifestName, e2)) {
      continue;
    }
    tags.push_back(name);
  }
  std::sort(tags.begin(), tags.end(), step_order);
  return tags;
}

std::string resolve_tag(const fs::path& dir, const std::string& tag, const TagWording& wording) {
  std::error_code ec;
  ZERO_CHECK(fs::is_directory(dir, ec), "no checkpoint folder ", dir.string(),
             ": give the folder the checkpoints were saved to (zero-train: --save-dir)");
  // A tag's own folder given for the folder of checkpoints (ck/step-6 for ck).
  if (fs::exists(dir / kManifestName, ec)) {
    const fs::path full = fs::weakly_canonical(dir, ec);
    ZERO_CHECK(false, dir.string(), " is one checkpoint (it holds ", kManifestName,
               "), not the folder of checkpoints: give its parent folder ", full.parent_path().string(), " and ",
               wording.option, " ", full.filename().string());
  }
  const std::vector<std::string> tags = list_tags(dir);
  // What dir holds and how to pick from it, for the errors below.
  auto holds = [&] {
    if (tags.empty()) {
      const std::vector<std::string> partial = list_partials(dir);
      return zero::detail::str_cat(dir.string(), " holds no finished checkpoint",
                                   partial.empty() ? "" : " (only unfinished saves: " + join(partial) + ")", ": ",
                                   wording.if_none);
    }
    if (tags.size() == 1) {
      return zero::detail::str_cat(dir.string(), " holds ", tags[0], ": give ", wording.option, " ", tags[0]);
    }
    return zero::detail::str_cat(dir.string(), " holds ", join(tags), ": give ", wording.option, " ", tags.back(),
                                 " (the newest by step) or another of them");
  };
  std::string t = tag;
  if (tag == kLatestName) {
    const fs::path latest = dir / kLatestName;
    ZERO_CHECK(fs::exists(latest, ec), "no '", kLatestName, "' file in ", dir.string(),
               " (it names the newest finished save); ", holds());
    t = read_text(latest, 4096);
    while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ')) t.pop_back();
    ZERO_CHECK(is_plain_file_name(t), dir.string(), "/", kLatestName, " names '", t,
               "', which is not a checkpoint tag: the file is damaged; ", holds());
  } else {
    check_tag(tag);
  }
  const fs::path manifest = dir / t / kManifestName;
  if (!fs::exists(manifest, ec)) {
    const bool partial = fs::exists(partial_path(dir, t), ec);
    // A save of a tag that existed, stopped between moving the earlier one
    // aside and renaming the new one in (a file system without
    // RENAME_EXCHANGE): the earlier one is whole.
    const fs::path replaced = dir / (t + kReplaced);
    ZERO_CHECK(!fs::exists(replaced / kManifestName, ec), "no checkpoint '", t, "' in ", dir.string(),
               ": a save of it stopped while replacing it, and the earlier '", t, "' is whole in ", replaced.string(),
               ": rename that folder to ", (dir / t).string(), " to load it (mv ", replaced.string(), " ",
               (dir / t).string(), ")");
    ZERO_CHECK(false, "no checkpoint '", t, "' in ", dir.string(), " (", manifest.string(), " is missing",
               partial ? ": its save did not finish, only " + t + ".partial exists" : "",
               tag == kLatestName ? ", though 'latest' names it" : "", "); ", holds());
  }
  return t;
}

}  // namespace zero::ckpt
