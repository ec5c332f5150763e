// One exception type for every user-facing failure: its message is the one line
// the CLI prints. Throw it with a message that names the problem and the input.
#pragma once
#include <stdexcept>
#include <string>

namespace tessera {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace tessera
