#include "zero/data/text_corpus.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include <sys/stat.h>

#include "zero/core/error.h"
#include "zero/core/file_kind.h"

namespace zero::data {

namespace fs = std::filesystem;

bool looks_binary(const std::string& bytes) {
  if (bytes.find('\0') != std::string::npos) return true;
  std::size_t control = 0;
  for (unsigned char c : bytes) {
    if (c < 0x20 && c != '\n' && c != '\r' && c != '\t' && c != '\f' && c != 0x1b) ++control;
  }
  return control * 20 > bytes.size();  // more than 5% control bytes
}

double Corpus::unigram_entropy_nats() const {
  std::array<double, 256> counts{};
  for (std::uint8_t b : train) counts[b] += 1.0;
  double h = 0.0;
  const double n = static_cast<double>(train.size());
  for (double c : counts) {
    if (c > 0) h -= (c / n) * std::log(c / n);
  }
  return h;
}

fs::path default_corpus_path() { return "/usr/share/games/fortunes"; }

std::vector<fs::path> default_corpus_files(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {dir};  // load_corpus names the missing path and the fix
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    // Only the top level: Debian puts offensive fortunes (fortunes-off) in off/
    // and other languages (fortunes-de, -fr, ...) in their own subfolders.
    // file.dat is strfile's binary index; file.u8 is a symlink to file.
    const std::string ext = e.path().extension().string();
    if (e.is_symlink() || !e.is_regular_file() || ext == ".dat" || ext == ".u8") continue;
    files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) files.push_back(dir);  // load_corpus: "empty or too small"
  return files;
}

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  ZERO_CHECK(in.good(), "cannot read corpus file ", p, ": check the path and its permissions");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

Corpus load_corpus(const std::vector<fs::path>& paths, double validation_fraction) {
  ZERO_CHECK(!paths.empty(), "no corpus given: name text files or folders");
  ZERO_CHECK(validation_fraction > 0.0 && validation_fraction < 1.0,
             "validation fraction must be in (0, 1), got ", validation_fraction);
  Corpus c;
  std::vector<std::uint8_t> all;
  std::size_t text_bytes = 0;  // as read (`all` adds a newline where a file lacks its last)
  auto add_text = [&](const std::string& text) {
    text_bytes += text.size();
    ++c.files;
    if (text.empty()) {
      ++c.empty_files;
      return;
    }
    all.insert(all.end(), text.begin(), text.end());
    if (all.back() != '\n') all.push_back('\n');
  };
  // Each file is read once, however it is reached (a link to a file read
  // already, such as fortunes' .u8 links, a hard link, or a path given
  // twice): by its device and inode.
  std::set<std::pair<dev_t, ino_t>> seen;
  auto first_time = [&](const fs::path& f) {
    struct stat st {};
    if (::stat(f.c_str(), &st) != 0) return true;  // (read_file names the problem)
    if (seen.insert({st.st_dev, st.st_ino}).second) return true;
    ++c.duplicates;
    return false;
  };
  for (const fs::path& path : paths) {
    std::error_code ec;
    const bool exists = fs::exists(path, ec);
    ZERO_CHECK(!ec || ec == std::errc::no_such_file_or_directory, "corpus path ", path, " cannot be read: ",
               ec.message(), " (a link that leads back to itself?): name the file or folder it should lead to");
    ZERO_CHECK(exists, "corpus path ", path,
               " does not exist: name text files or folders of them (the default is ",
               default_corpus_path(), ", from Debian's `fortunes` package; scripts/setup installs it)");
    if (fs::is_directory(path, ec)) {
      std::vector<fs::path> files;
      // Links to files are read (a dataset cache's snapshot is links to its
      // blobs); links to folders are not followed (a link may lead back up).
      // A folder inside that cannot be listed is named, as a file is.
      fs::path at = path;
      auto listing_failed = [&](const std::error_code& e) {
        ZERO_CHECK(false, "cannot list the corpus folder ", at, e ? ": " + e.message() : std::string(),
                   ": check its permissions, or name the readable files and folders instead of ", path);
      };
      fs::recursive_directory_iterator it(path, fs::directory_options::none, ec);
      if (ec) listing_failed(ec);
      for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (ec) listing_failed(ec);
        const fs::directory_entry& e = *it;
        at = e.path();
        std::error_code type_ec;
        if (e.is_regular_file(type_ec)) {
          files.push_back(e.path());
        } else if (e.is_symlink(type_ec) && !e.is_directory(type_ec)) {
          ++c.skipped_links;  // (to nothing, or to a device or a pipe)
        } else if (e.is_symlink(type_ec)) {
          ++c.skipped_links;
          it.disable_recursion_pending();
        } else if (!e.is_directory(type_ec)) {
          ++c.skipped_special;  // a pipe, a socket, a device
        }
      }
      if (ec) listing_failed(ec);
      std::sort(files.begin(), files.end());
      for (const fs::path& f : files) {
        if (!first_time(f)) continue;
        std::string text = read_file(f);
        if (looks_binary(text)) {
          ++c.skipped_binary;
          continue;
        }
        add_text(text);
      }
    } else {
      // Read whole, on every rank: a pipe could be read by one rank only,
      // and a device such as /dev/zero never ends.
      const fs::file_status st = fs::status(path, ec);
      ZERO_CHECK(st.type() == fs::file_type::regular, "corpus path ", path, " is ", file_kind_name(st.type()),
                 ", not a file or a folder: give text files (every rank reads them whole; write a stream to a "
                 "file first)");
      if (!first_time(path)) continue;
      std::string text = read_file(path);
      ZERO_CHECK(!looks_binary(text), "corpus file ", path,
                 " looks binary (NUL or many control bytes): give text files");
      add_text(text);
    }
  }
  ZERO_CHECK(all.size() >= 1024, "the corpus is empty or too small (", text_bytes,
             " bytes of text in ", c.files, " file(s)",
             c.empty_files ? ", " + std::to_string(c.empty_files) + " of them empty" : std::string(), c.skipped_binary ? ", binary files skipped" : "",
             "): give at least 1 KiB of text (a model learns little from less than a few hundred KiB)");
  const std::size_t n_val = std::max<std::size_t>(
      1, static_cast<std::size_t>(static_cast<double>(all.size()) * validation_fraction));
  c.train.assign(all.begin(), all.end() - static_cast<std::ptrdiff_t>(n_val));
  c.validation.assign(all.end() - static_cast<std::ptrdiff_t>(n_val), all.end());
  return c;
}

}  // namespace zero::data
