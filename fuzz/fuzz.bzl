"""dcp_fuzzer: one libFuzzer target and the test that replays its corpus."""

load("@rules_cc//cc:defs.bzl", "cc_test")

def dcp_fuzzer(name, deps):
    """Declares the corpus test of fuzz target `name`.

    The target's code is <name>_fuzzer.cc (defining LLVMFuzzerTestOneInput)
    and its committed corpus fuzz/corpus/<name>/ (at least one file).
    `<name>_fuzzer_test` links the code with the corpus driver and replays
    every corpus file. tools/fuzz.sh builds the same code with clang and
    libFuzzer, taking its sources from this test's dependencies.

    Args:
      name: the target's name: the file stem before _fuzzer.cc.
      deps: the libraries the target calls.
    """
    cc_test(
        name = name + "_fuzzer_test",
        size = "small",
        srcs = [name + "_fuzzer.cc"],
        args = ["fuzz/corpus/" + name],
        data = native.glob(["corpus/" + name + "/**"]),
        deps = deps + [
            ":corpus_driver",
            ":fuzz_check",
        ],
    )
