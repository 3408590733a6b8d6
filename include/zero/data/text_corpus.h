// A text corpus as bytes, for byte-level language modelling (vocabulary 256:
// token = byte, see byte_tokenizer.h).
//
// load_corpus() reads the files and folders named (folders recursively, in
// sorted order, so every rank reads the same bytes), separates documents with
// a newline, and splits the result deterministically: the last
// `validation_fraction` of the bytes is the validation set.
//
// Errors name the fix: a missing path, an empty corpus, a binary file named
// directly (a NUL byte, or many control bytes), a file or a folder inside
// one that cannot be read. Inside a folder, binary files (such as fortune's
// .dat indexes), pipes and devices are skipped and counted.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace zero::data {

struct Corpus {
  std::vector<std::uint8_t> train, validation;
  std::int64_t files = 0, skipped_binary = 0;
  std::int64_t empty_files = 0;  // of `files`: empty ones (they add no text)
  // In folders: links to folders (not followed: name the folder itself) and
  // links to nothing, to a device or to a pipe; pipes, sockets and devices
  // themselves; and files met again (through a link, a hard link, or a path
  // given twice), read once.
  std::int64_t skipped_links = 0, skipped_special = 0, duplicates = 0;
  // Entropy of the byte distribution of the training bytes, in nats: the
  // loss of the best model that ignores context.
  double unigram_entropy_nats() const;
};

Corpus load_corpus(const std::vector<std::filesystem::path>& paths, double validation_fraction = 0.1);

// The corpus used when none is given: the English text of Debian's
// `fortunes` package (installed by scripts/setup).
std::filesystem::path default_corpus_path();
// The files of the default corpus, sorted: the regular files at the top level
// of `dir` (the English fortunes), without subfolders (off/, other languages),
// strfile's .dat indexes or the .u8 symlinks. A missing folder is returned as
// is, so that load_corpus reports it.
std::vector<std::filesystem::path> default_corpus_files(
    const std::filesystem::path& dir = default_corpus_path());

// True when the bytes do not look like text (used for the check above).
bool looks_binary(const std::string& bytes);

}  // namespace zero::data
