#include "backend/factory/backend_factory.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace metrale {

std::vector<std::string> backend_names() { return {"cpu"}; }

std::unique_ptr<Backend> make_backend(const BackendOptions& o) {
  if (o.device == "cpu") {
    METRALE_CHECK(o.pool != nullptr, "backend cpu: needs a thread pool");
    return std::make_unique<CpuBackend>(*o.pool, o.compute);
  }
  std::string known;
  for (const std::string& n : backend_names()) known += (known.empty() ? "" : ", ") + n;
  throw make_error("unknown backend '", o.device, "' (this build has: ", known, ")");
}

}  // namespace metrale
