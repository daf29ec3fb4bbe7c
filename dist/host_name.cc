// This host's name; see host_name.h.
#include "dist/host_name.h"

#include <unistd.h>

namespace dist {

std::string HostName() {
  char name[256] = {};  // HOST_NAME_MAX is 64 on Linux
  if (::gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

}  // namespace dist
