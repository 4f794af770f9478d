// The test binary is built from tests/tools/*.cpp and the flare library only, while the .npy
// codec belongs to the tool (tools/flare/npy.cpp): compile the tool's codec into the tests so
// they exercise the very code the CLI runs.
#include "tools/flare/npy.cpp"  // NOLINT(bugprone-suspicious-include)
