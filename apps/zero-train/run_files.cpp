#include "run_files.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zero/core/error.h"

namespace zero::train {
namespace {

// The step a line is of: metrics.jsonl's "step", the .dat files' first
// number; -1 when the line has none (it is dropped).
std::int64_t step_of(const std::string& line, bool json) {
  if (json) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    return j.is_object() && j.contains("step") && j["step"].is_number_integer() ? j["step"].get<std::int64_t>() : -1;
  }
  std::istringstream in(line);
  std::int64_t step = -1;
  return in >> step ? step : -1;
}

// The highest step of a line of `path` (0: none, or no file).
std::int64_t last_step(const std::filesystem::path& path, bool json) {
  std::ifstream in(path);
  std::int64_t last = 0;
  for (std::string line; std::getline(in, line);) last = std::max(last, step_of(line, json));
  return last;
}

// The lines of `path` of steps 1..first_step, written back; returns how many.
std::size_t trim(const std::filesystem::path& path, std::int64_t first_step, bool json) {
  std::ifstream in(path);
  if (!in) return 0;
  std::vector<std::string> kept;
  for (std::string line; std::getline(in, line);) {
    const std::int64_t step = step_of(line, json);
    if (step >= 1 && step <= first_step) kept.push_back(line);
  }
  in.close();
  std::ofstream out(path, std::ios::trunc);
  for (const std::string& line : kept) out << line << "\n";
  return kept.size();
}

// Why a write failed, as the stream's last system call left it.
std::string write_error() { return errno != 0 ? std::strerror(errno) : "a write error"; }

}  // namespace

std::string RunFiles::open(const std::filesystem::path& dir, std::int64_t first_step) {
  dir_ = dir;
  auto mode = first_step > 0 ? std::ios::app : std::ios::trunc;
  std::string moved;
  if (first_step > 0) {
    // Lines that stop short of the checkpoint's step are another run's
    // (its --out reused) or incomplete: kept, they would splice that run's
    // curve before this one's. Moved aside, not deleted.
    const std::int64_t last = last_step(dir / "metrics.jsonl", /*json=*/true);
    if (last > 0 && last < first_step) {
      for (const char* name : {"metrics.jsonl", "loss.dat", "val.dat"}) {
        std::error_code ec;
        if (std::filesystem::exists(dir / name, ec)) {
          std::filesystem::rename(dir / name, dir / (std::string(name) + ".old"), ec);
          ZERO_CHECK(!ec, "--out ", dir.string(), ": cannot move ", name, " aside to ", name, ".old (",
                     ec.message(), "); give another --out");
        }
      }
      moved = "--out " + dir.string() + " held metrics up to step " + std::to_string(last) +
              " only, not up to the checkpoint's step " + std::to_string(first_step) +
              ": another run's (or lines lost); moved aside as metrics.jsonl.old, loss.dat.old, val.dat.old, "
              "and this run's files start at step " + std::to_string(first_step + 1);
      mode = std::ios::trunc;
    }
  }
  if (first_step > 0 && moved.empty()) {
    trim(dir / "metrics.jsonl", first_step, /*json=*/true);
    trim(dir / "loss.dat", first_step, /*json=*/false);
    val_points = trim(dir / "val.dat", first_step, /*json=*/false) > 0;
  }
  metrics.open(dir / "metrics.jsonl", std::ios::out | mode);
  loss.open(dir / "loss.dat", std::ios::out | mode);
  val.open(dir / "val.dat", std::ios::out | mode);
  ZERO_CHECK(metrics && loss && val, "--out ", dir.string(), ": cannot write metrics.jsonl, loss.dat and val.dat "
             "there (", std::strerror(errno), "); give a writable folder (--out)");
  return moved;
}

bool RunFiles::note_failure(const std::string& what) {
  if (!failure_.empty()) return false;
  failure_ = "--out " + dir_.string() + ": " + what;
  return true;
}

bool RunFiles::flush(std::int64_t step) {
  errno = 0;
  metrics.flush();
  loss.flush();
  val.flush();
  if (metrics && loss && val) return false;
  return note_failure("writing metrics.jsonl, loss.dat and val.dat failed at step " + std::to_string(step) + " (" +
                      write_error() + "): they lack that step and the ones after it");
}

void RunFiles::close() {
  errno = 0;
  metrics.close();
  loss.close();
  val.close();
  if (!metrics || !loss || !val) {
    note_failure("writing metrics.jsonl, loss.dat and val.dat failed as they were closed (" + write_error() +
                 "): their last lines may be missing");
  }
  std::error_code ec;
  if (!std::filesystem::exists(dir_ / "metrics.jsonl", ec)) {
    note_failure("metrics.jsonl is no longer there: the folder was removed or moved during the run, and the "
                 "metrics went with it");
  }
}

}  // namespace zero::train
