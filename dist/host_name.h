// This host's name (gethostname), for the names of claims, locks and
// temporary files, and for a peer's address: "" when the host has none.
#ifndef DIST_HOST_NAME_H_
#define DIST_HOST_NAME_H_

#include <string>

namespace dist {

std::string HostName();

}  // namespace dist

#endif  // DIST_HOST_NAME_H_
