#pragma once
// Makes the backend a model runs on, by name, so the engine never names a device class.
// "cpu" always exists; a CUDA backend registers here when it is built.
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace metrale {

class ThreadPool;

struct BackendOptions {
  std::string device = "cpu";
  ThreadPool* pool = nullptr;  // cpu: the threads every op runs on (must outlive the backend)
  Compute compute = Compute::kF32;
};

// Throws Error naming the device and the ones this build has when `device` is unknown.
std::unique_ptr<Backend> make_backend(const BackendOptions& options);
std::vector<std::string> backend_names();

}  // namespace metrale
