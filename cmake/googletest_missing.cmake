# Run by the test that stands in for the GoogleTest suites when configure did not find GoogleTest.
message(FATAL_ERROR "GoogleTest is missing: the test suites (tests/cpu, tests/gpu) were not built. Install "
                    "GoogleTest (Debian/Ubuntu: apt install libgtest-dev), then configure and build again.")
