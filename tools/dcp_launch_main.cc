// dcp_launch: see tools/launch.h.
#include "tools/launch.h"

int main(int argc, char** argv) { return dcp::tools::LaunchMain(argc, argv); }
