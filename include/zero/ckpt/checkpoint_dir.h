// The folder of checkpoints and how one becomes visible atomically:
//
//   <dir>/<tag>.partial/   files go here first (every rank writes its own)
//   <dir>/<tag>/           renamed from .partial once every file and the
//                          manifest are fsync'd
//   <dir>/latest           the newest tag, replaced (write, fsync, rename)
//                          after the rename
//
// A crash at any moment leaves every committed tag and `latest` loadable: a
// half-written save is only ever a .partial folder, removed by the next save
// of that tag. A tag saved again swaps with its new save in one
// renameat2(RENAME_EXCHANGE); a tag removed is renamed to <tag>.removing
// before its files go.
#pragma once

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace zero::ckpt {

inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kLatestName = "latest";

// A tag is a plain name (manifest.h's is_plain_file_name), not "latest", not
// ending in ".partial": a clear error otherwise.
void check_tag(const std::string& tag);
std::filesystem::path partial_path(const std::filesystem::path& dir, const std::string& tag);
// The name of rank r's file.
std::string shard_file_name(int rank, int world);

// Rank 0, before the ranks write: creates dir and an empty <tag>.partial
// (removing a stale one). Errors name the folder and the fix.
void prepare_partial(const std::filesystem::path& dir, const std::string& tag);
// Rank 0, after every rank's file is fsync'd: the manifest into the partial
// folder (fsync'd), the rename to <tag> (a tag saved before is replaced),
// then `latest`.
// A rename that succeeded and a `latest` that could not follow: an error
// whose message holds committed_without_latest(tag) (the checkpoint is
// complete; the caller may count it as saved).
void commit(const std::filesystem::path& dir, const std::string& tag, const std::string& manifest_json);
std::string committed_without_latest(const std::string& tag);

// The committed tags in dir (subfolders holding a manifest), in step order
// (step-2 before step-10); none when dir is not a folder.
std::vector<std::string> list_tags(const std::filesystem::path& dir);

// How resolve_tag's errors name the caller's options, so that they say what
// to type: zero-train {"--resume", "start without --resume"}, zero-ckpt
// {"--tag", ...}.
struct TagWording {
  std::string option = "the tag";  // what names the tag
  std::string if_none = "save one first";  // the fix when dir holds no checkpoint
};
// "latest" -> the tag the pointer names; another tag as it is. Checks that
// the tag's manifest exists; errors say what is there instead (the tags
// found, or that dir is itself one checkpoint's folder).
std::string resolve_tag(const std::filesystem::path& dir, const std::string& tag, const TagWording& wording = {});
// The whole text of a (small) file; errors name it.
std::string read_text(const std::filesystem::path& path, std::size_t max_bytes = std::size_t{64} << 20);
// Writes `text` to path atomically (tmp, fsync, rename, fsync the folder).
void write_text_atomic(const std::filesystem::path& path, const std::string& text);
void fsync_dir(const std::filesystem::path& dir);
// Removes checkpoint `tag` of dir: renamed to <tag>.removing (no longer
// listed), then deleted. ec holds the first failure.
void remove_tag(const std::filesystem::path& dir, const std::string& tag, std::error_code& ec);
// Removes what removals stopped half-way left (<tag>.removing folders), best
// effort: rotation calls it before it removes.
void sweep_removals(const std::filesystem::path& dir);
// Removes `path` and everything below it (no error when it does not exist).
// Not std::filesystem::remove_all: LibTorch's libtorch.so exports its own
// copy of that symbol, which the dynamic linker may bind instead, and which
// crashed (a call through a null pointer) in a test on torch 2.11.
void remove_tree(const std::filesystem::path& path, std::error_code& ec);

}  // namespace zero::ckpt
