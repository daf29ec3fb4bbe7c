// The layout of a train checkpoint directory: one folder per saved step
// ("step_000100", single-process or sharded) and a `latest` file naming the
// newest; creating and checking the directory, pointing `latest`, and what
// errors about a step folder say about the others beside it (the other
// checkpoints, a copy an interrupted save set aside, leftovers).
#ifndef MODELS_COMMON_CHECKPOINT_DIR_H_
#define MODELS_COMMON_CHECKPOINT_DIR_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace train {

// "step_000100": the folder of a step under a checkpoint directory.
std::string CheckpointStepName(int64_t step);
// N of a step folder's name "step_N" (digits only); -1 for another name (a
// save's ".tmp-*" or ".old-*" copy, "step_+1").
int64_t StepOfName(const std::string& name);
// Creates `dir` and its missing parents unless it exists.
absl::Status MakeCheckpointDir(const std::string& dir);
// Before training: creates `dir` (and its parents) and checks that a file can
// be created and removed there, so that an unusable --checkpoint_dir fails at
// once (InvalidArgument naming it and why) instead of at the first save,
// after the steps it would have kept. With report_leftovers, the folders
// LeftoversOfInterruptedSaves names are a warning on stderr.
absl::Status PrepareCheckpointDir(const std::string& dir, bool report_leftovers = true);
// The step folders' temporaries that saves killed midway left in `dir`
// ("step_N.tmp-*", and "step_N.old-*" beside a step_N that is back), each
// with its size, and that they may be removed; "" when there are none. They
// are only named: a run saving into `dir` at the same time may own them.
std::string LeftoversOfInterruptedSaves(const std::string& dir);
// Points <dir>/latest at step_<step> (written durably).
absl::Status SetLatestCheckpoint(const std::string& dir, int64_t step);
bool IsShardedCheckpoint(const std::string& step_dir);  // it holds index.json
// A sharded step folder that lost its index: "" unless `step_dir` holds
// shard files ("shard_<r>_of_<n>.safetensors") but neither index.json nor
// model.safetensors; then the error's text, naming them.
std::string ShardsWithoutIndex(const std::string& step_dir);
// A step folder of either format: sharded, or holding model.safetensors.
bool HoldsCheckpoint(const std::string& step_dir);
// A single-process step folder that holds model.safetensors but no
// optimizer.safetensors (removed to keep the model alone): sampling, export
// and --init_from read it; a resume cannot.
bool IsModelOnly(const std::string& step_dir);
// DataLoss when IsModelOnly(step_dir) (kept alone on purpose, or a copy cut
// short): `action` ("cannot be resumed") needs the optimizer state; names
// --init_from, which starts a run from the model.
absl::Status CheckNotModelOnly(const std::string& step_dir, const std::string& action);
// Step folder `name` of `dir` as lists of checkpoints say it: with
// " (model only)" when IsModelOnly.
std::string SaidStepFolder(const std::filesystem::path& dir, const std::string& name);
// The step folder name dir/latest holds ("step_000100"); "" when it is
// missing, empty, cannot be read, or holds no folder name of `dir` (a path,
// "..", control characters).
std::string LatestStepName(const std::string& dir);
// The folder of `step_dir` and the folder it sits in ("." when none).
std::pair<std::filesystem::path, std::filesystem::path> FolderAndParent(
    const std::string& step_dir);
// The step folders in `dir` holding a checkpoint, newest first, but `except`.
std::vector<std::string> StepFoldersIn(const std::filesystem::path& dir,
                                       const std::string& except = "");
// The other step folders beside `step_dir` that hold a checkpoint, newest
// first (a model-only one said as such), and, when `resuming`, how to resume
// the newest that holds its optimizer state; or that there are none: text to
// append to an error about `step_dir`.
std::string OtherCheckpointsNote(const std::string& step_dir, bool resuming = true);
// A missing step folder whose save was interrupted between its two renames
// (tensor::ReplaceFolderDurably without RENAME_EXCHANGE: the old folder moved
// aside to "<folder>.old-<tag>", the new one not yet renamed into place): how
// to get it back; "" when there is no such copy.
std::string InterruptedSaveNote(const std::string& step_dir);

}  // namespace train

#endif  // MODELS_COMMON_CHECKPOINT_DIR_H_
