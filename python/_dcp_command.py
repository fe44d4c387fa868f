"""The wheel's `dcp` script, and `python -m dcp`: the dcp command line
(inspect, verify, convert, demo; `dcp --help`) that the wheel carries as
dcp/_bin/dcp (tools/build_wheel.sh); from a source checkout, its
bazel-bin/tools/dcp. DCP_TOOL names another binary to run instead.

A module of its own, outside the dcp package: the script finds the binary
without running dcp/__init__.py, which imports torch (a second and about
500 MB before `dcp inspect` starts)."""

from __future__ import annotations

import importlib.util
import os
import sys


def tool_path() -> str | None:
    """The dcp binary: $DCP_TOOL, else the wheel's, else a source
    checkout's bazel-bin/tools/dcp (as the library is looked up), else
    None."""
    chosen = os.environ.get("DCP_TOOL")
    if chosen:
        return chosen
    spec = importlib.util.find_spec("dcp")  # located, not imported
    if spec is None or not spec.submodule_search_locations:
        return None
    package = list(spec.submodule_search_locations)[0]
    bundled = os.path.join(package, "_bin", "dcp")
    if os.access(bundled, os.X_OK):
        return bundled
    built = os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(package))), "bazel-bin", "tools", "dcp")
    return built if os.access(built, os.X_OK) else None


def main(argv: list[str] | None = None) -> int:
    """Replaces this process with the dcp binary and `argv` (default:
    sys.argv[1:]); returns 2 with a message when there is none."""
    args = sys.argv[1:] if argv is None else argv
    path = tool_path()
    if path is None:
        print("dcp: this installation has no dcp command-line binary (a "
              "wheel built without one, or a source checkout not built "
              "yet): build it with `bazel build //tools:dcp` (a checkout's "
              "bazel-bin/tools/dcp is then found), or set DCP_TOOL to the "
              "binary", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(path, [path] + list(args))
    except OSError as e:
        print(f"dcp: cannot run {path}: {e}", file=sys.stderr)
        return 2
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
