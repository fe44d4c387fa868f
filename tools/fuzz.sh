#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan + libFuzzer)
# outside Bazel, then fuzzes each for a bounded time.
#
#   tools/fuzz.sh [--seconds N] [--seed S] [--build-only] [NAME...]
#
# NAME is a target of fuzz/ (fuzz/NAME_fuzzer.cc; default: all of them).
# Each runs N seconds (default 30) from its committed corpus fuzz/corpus/NAME
# plus what earlier runs found (.cache/fuzz/corpus/NAME). Exit status 0 when
# no target crashed, 1 when one did (the reproducer's path is printed; add it
# to fuzz/corpus/NAME under a descriptive name, so `bazel test //fuzz:all`
# replays it from then on), 2 on a usage or build error. --seed S fixes
# libFuzzer's random seed: from the same corpora, a run of the same length
# on a machine of the same speed mutates the same inputs (CI passes one, so
# that a run which passed here passes there; fuzz by hand without it, or
# for longer, to look further).
#
# Bazel keeps building with gcc: this script asks Bazel only which sources
# and system libraries a target's corpus test (//fuzz:NAME_fuzzer_test) uses
# and for the generated protobuf sources, and compiles those itself with
# clang into .cache/fuzz (make: only what changed is rebuilt; Bazel is not
# asked again until a BUILD file of those packages or a .proto changes).
set -euo pipefail

readonly USAGE="usage: tools/fuzz.sh [--seconds N] [--seed S] [--build-only] [NAME...]"
seconds=30
seed=""
build_only=0
names=()
while (($#)); do
  case "$1" in
    --seconds)
      [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || { echo "$USAGE" >&2; exit 2; }
      seconds="$2"
      shift 2
      ;;
    --seed)
      [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || { echo "$USAGE" >&2; exit 2; }
      seed="$2"
      shift 2
      ;;
    --build-only) build_only=1; shift ;;
    -h | --help) echo "$USAGE"; exit 0 ;;
    -*) echo "$USAGE" >&2; exit 2 ;;
    *) names+=("$1"); shift ;;
  esac
done

cd "$(dirname "$0")/.."
if ((${#names[@]} == 0)); then
  for source in fuzz/*_fuzzer.cc; do
    stem="${source#fuzz/}"
    names+=("${stem%_fuzzer.cc}")
  done
fi
for name in "${names[@]}"; do
  if [[ ! -f "fuzz/${name}_fuzzer.cc" ]]; then
    echo "no fuzz target '$name' (fuzz/${name}_fuzzer.cc)" >&2
    exit 2
  fi
done
command -v clang++ > /dev/null || { echo "clang++ not found" >&2; exit 2; }

readonly cache=.cache/fuzz
mkdir -p "$cache/corpus" "$cache/artifacts" "$cache/logs" "$cache/bin"

# The hash of what a target's source list depends on: fuzz/fuzz.bzl, the
# BUILD files of its packages and its .proto files.
stamp_of() {
  local deps_file="$1"
  {
    cat fuzz/fuzz.bzl
    local path
    for path in $(sed -n 's/^\(package\|proto\) //p' "$deps_file"); do
      cat "$path" 2> /dev/null || echo "missing $path"
    done
  } | sha256sum | cut -d' ' -f1
}

# Writes $cache/NAME.query: the target's sources (src), generated sources
# (gen), link flags (lib), package BUILD files and .proto files (for the
# stamp), and whether it links the static CUDA runtime (cuda).
query_deps() {
  local target="//fuzz:${1}_fuzzer_test" out="$cache/$1.query"
  local kinds libs
  kinds="$(bazel query --output=label_kind "deps($target)" 2> "$bazel_log")" || {
    cat "$bazel_log" >&2
    exit 2
  }
  libs="$(bazel query --output=build \
    "kind(cc_library, filter('^//third_party:', deps($target)))" \
    2> "$bazel_log" | grep -o '"-l[^"]*"' | tr -d '"' | sort -u)" || {
    cat "$bazel_log" >&2
    exit 2
  }
  {
    awk '
      $3 ~ /^\/\/third_party[:\/]/ || $3 == "//fuzz:corpus_driver.cc" { next }
      $1 == "source" && $3 ~ /^\/\/[^:]*:.*\.cc$/ {
        sub(/^\/\//, "", $3); sub(/:/, "/", $3); sub(/^\//, "", $3)
        print "src " $3; next
      }
      $1 == "source" && $3 ~ /\.proto$/ {
        sub(/^\/\//, "", $3); sub(/:/, "/", $3); sub(/^\//, "", $3)
        print "proto " $3; next
      }
      $1 == "generated" && $3 ~ /^\/\/.*\.cc$/ { print "gen " $3; next }
      $3 ~ /^@cuda\/\// { cuda = 1 }
      $3 ~ /^\/\/[^:]*:/ {
        package = $3; sub(/^\/\//, "", package); sub(/:.*/, "", package)
        packages[package] = 1
      }
      END {
        for (p in packages) print "package " (p == "" ? "" : p "/") "BUILD.bazel"
        if (cuda) print "cuda"
      }' <<< "$kinds" | sort -u
    for lib in $libs; do echo "lib $lib"; done
  } > "$out"
}

# Sources per target, from $cache/NAME.deps while its stamp holds and its
# generated sources exist; Bazel is asked (serialized behind other builds)
# only for the others, once for all of them.
readonly bazel_log="$cache/logs/bazel.log"
stale=()
for name in "${names[@]}"; do
  deps_file="$cache/$name.deps"
  if [[ ! -f "$deps_file" || ! -f "$deps_file.stamp" ||
    "$(stamp_of "$deps_file")" != "$(cat "$deps_file.stamp")" ]]; then
    stale+=("$name")
    continue
  fi
  bazel_bin="$(sed -n 's/^bazel_bin //p' "$deps_file")"
  for gen in $(sed -n 's/^gen \/\/\(.*\):\(.*\)$/\1\/\2/p' "$deps_file"); do
    if [[ ! -f "$bazel_bin/$gen" ]]; then
      stale+=("$name")
      break
    fi
  done
done
if ((${#stale[@]})); then
  echo "fuzz: asking Bazel for the sources of ${stale[*]}"
  for name in "${stale[@]}"; do query_deps "$name"; done
  info="$(bazel info bazel-bin output_base 2> "$bazel_log")" || {
    cat "$bazel_log" >&2
    exit 2
  }
  # Generated sources come from the ordinary (gcc) configuration.
  gens="$(for name in "${stale[@]}"; do
    sed -n 's/^gen //p' "$cache/$name.query"
  done | sort -u)"
  if [[ -n "$gens" ]]; then
    # shellcheck disable=SC2086
    bazel build $gens > "$bazel_log" 2>&1 || {
      cat "$bazel_log" >&2
      exit 2
    }
  fi
  for name in "${stale[@]}"; do
    {
      echo "bazel_bin $(sed -n 's/^bazel-bin: //p' <<< "$info")"
      echo "output_base $(sed -n 's/^output_base: //p' <<< "$info")"
      cat "$cache/$name.query"
    } > "$cache/$name.deps"
    rm "$cache/$name.query"
    stamp_of "$cache/$name.deps" > "$cache/$name.deps.stamp"
  done
fi

# One Makefile for every target: objects are shared, and each records its
# headers (-MMD) so that an edited header rebuilds what includes it.
readonly sanitize="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
declare -A gen_rule_written=()
rules=""
all_bins=""
tab=$'\t'
for name in "${names[@]}"; do
  deps_file="$cache/$name.deps"
  bazel_bin="$(sed -n 's/^bazel_bin //p' "$deps_file")"
  output_base="$(sed -n 's/^output_base //p' "$deps_file")"
  objs=""
  for src in $(sed -n 's/^src //p' "$deps_file"); do
    objs+=" \$(OBJ)/src/${src%.cc}.o"
  done
  for gen in $(sed -n 's/^gen \/\/\(.*\):\(.*\)$/\1\/\2/p' "$deps_file"); do
    obj="\$(OBJ)/gen/${gen%.cc}.o"
    objs+=" $obj"
    if [[ -z "${gen_rule_written[$gen]:-}" ]]; then
      gen_rule_written[$gen]=1
      rules+="$obj: $bazel_bin/$gen \$(FLAGS_FILE)"$'\n'"$tab\$(COMPILE)"$'\n'
    fi
  done
  libs="$(sed -n 's/^lib //p' "$deps_file" | tr '\n' ' ')"
  if grep -qx cuda "$deps_file"; then
    # @cuda//:cudart_static (third_party/cuda.BUILD): its headers and the
    # static runtime (which, without a driver, the targets never call).
    libs+=" $output_base/external/cuda/lib64/libcudart_static.a -ldl -lrt"
  fi
  bin="$cache/bin/${name}_fuzzer"
  all_bins+=" $bin"
  rules+="$bin:$objs"$'\n'"$tab@echo \"  LINK \$@\""$'\n'
  rules+="$tab@\$(CXX) $sanitize -fsanitize=fuzzer \$^ -o \$@ -Wl,--as-needed $libs -lpthread"$'\n'
done
# The same flags for every target (so that fuzzing a subset rebuilds
# nothing): the workspace, the generated headers, the CUDA headers.
includes="-I. -I$bazel_bin -isystem$output_base/external/cuda/include"
cat > "$cache/Makefile.tmp" << MAKEFILE
CXX := clang++
CXXFLAGS := -std=c++20 -O1 -g -fno-omit-frame-pointer -w $sanitize -fsanitize=fuzzer-no-link $includes
OBJ := $cache/obj
FLAGS_FILE := $cache/flags
COMPILE = @mkdir -p \$(@D) && echo "  CXX \$<" && \$(CXX) \$(CXXFLAGS) -MMD -MP -c \$< -o \$@
all:$all_bins
\$(OBJ)/src/%.o: %.cc \$(FLAGS_FILE)
$tab\$(COMPILE)
$rules
-include \$(shell find \$(OBJ) -name '*.d' 2> /dev/null)
MAKEFILE
mv "$cache/Makefile.tmp" "$cache/Makefile"
# Objects depend on the flags: the file is rewritten only when they change.
flags="$(grep '^CXXFLAGS' "$cache/Makefile")"
if [[ ! -f "$cache/flags" || "$(cat "$cache/flags")" != "$flags" ]]; then
  echo "$flags" > "$cache/flags"
fi
echo "fuzz: building ${names[*]}"
nice -n 10 make --no-print-directory -j"$(nproc)" -f "$cache/Makefile" all >&2 || {
  echo "fuzz: build failed" >&2
  exit 2
}
((build_only)) && exit 0

# Fuzzing. libFuzzer adds what it finds to the first corpus directory (the
# cache's), reads the committed one, and writes a crashing input to the
# artifact prefix.
failed=0
for name in "${names[@]}"; do
  work="$cache/corpus/$name"
  artifacts="$cache/artifacts/$name/"
  log="$cache/logs/$name.log"
  mkdir -p "$work" "$artifacts"
  echo "fuzz: $name for ${seconds}s (log: $log)"
  options=(-max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048
    -malloc_limit_mb=512 -print_final_stats=1 -artifact_prefix="$artifacts")
  # A dictionary of the format's tokens, where the target has one.
  [[ -f "fuzz/$name.dict" ]] && options+=(-dict="fuzz/$name.dict")
  [[ -n "$seed" ]] && options+=(-seed="$seed")
  status=0
  nice -n 10 "$cache/bin/${name}_fuzzer" "${options[@]}" \
    "$work" "fuzz/corpus/$name" > "$log" 2>&1 || status=$?
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")"
  rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")"
  progress="$(grep -E '^#[0-9]+' "$log" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[^ ]+' || true)"
  if ((status == 0)); then
    echo "fuzz: $name OK: ${execs:-?} runs, ${rate:-?}/s, $progress"
    continue
  fi
  failed=1
  echo "fuzz: $name FAILED (exit $status): ${execs:-?} runs, $progress"
  grep -E 'ERROR: |fuzz invariant failed|unexpected decode error|SUMMARY' "$log" | head -5 || true
  reproducer="$(grep -oE 'Test unit written to [^ ]+' "$log" | tail -1 | cut -d' ' -f5 || true)"
  if [[ -n "$reproducer" ]]; then
    echo "fuzz: reproducer: $reproducer"
    echo "fuzz:   rerun:    $cache/bin/${name}_fuzzer $reproducer"
    echo "fuzz:   keep it:  cp $reproducer fuzz/corpus/$name/<what-it-shows>"
  fi
  echo "fuzz: the whole report is in $log"
done
exit "$failed"
