#!/usr/bin/env bash
# readme_program.sh: the README's first program, as a reader would use it. Extracts the C block
# under "## Your first program" from README.md, checks it is at most 45 lines, installs the
# build into a fresh prefix (cmake --install), builds the program against that prefix only with
# the README's pkg-config commands (shared, with the rpath the README gives, so it runs with no
# LD_LIBRARY_PATH; and static, with loom-static), and runs it briefly: as written (DDP, 2 ranks),
# with the strategy line changed to FSDP as the README says, and with no strategy on 1 rank.
# Each run must train: the last loss printed below 80% of the first.
# Usage: readme_program.sh SOURCE_DIR BUILD_DIR
set -eu
src=$1 build=$2
work=$(mktemp -d /tmp/loom-readme-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "readme_program: $*" >&2; exit 1; }

awk '/^## Your first program/ {on = 1; next}
     on && /^## / {exit}
     on && /^```c$/ {inblock = 1; next}
     inblock && /^```$/ {exit}
     inblock {print}' "$src/README.md" > "$work/first.c"
lines=$(wc -l < "$work/first.c")
[ "$lines" -gt 10 ] || fail "no C block under '## Your first program' in README.md"
[ "$lines" -le 45 ] || fail "the README's program is $lines lines (at most 45)"
grep -q 'the strategy' "$work/first.c" || fail "the program has no line marked 'the strategy'"

prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null || fail "cmake --install failed"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
unset LD_LIBRARY_PATH

# the variants the README names: the strategy line as written (DDP), FSDP, and none
sed 's|LOOM_CHECK(loom_ddp_create_for_module(pg, model, NULL, &ddp));|LOOM_CHECK(loom_fsdp_create(pg, model, NULL, \&fsdp));|' \
  "$work/first.c" > "$work/fsdp.c"
grep -q 'loom_fsdp_create(pg, model' "$work/fsdp.c" || fail "the DDP line is not the README's"
grep -v 'the strategy' "$work/first.c" > "$work/none.c"

build_run() { # name source ranks link...
  local name=$1 c=$2 ranks=$3
  shift 3
  cc -std=c11 -Wall -Wextra -Werror -O2 -o "$work/$name" "$c" "$@" ||
    fail "$name: cc $* failed"
  local out
  out=$(timeout 300 "$work/$name" "$ranks" 301) || fail "$name: the program failed: $out"
  echo "$name: $(echo "$out" | tr '\n' ' ')"
  echo "$out" | awk '/^step [0-9]+ loss / {v[n++] = $4}
    END {if (n < 2 || !(v[n-1] < 0.8 * v[0])) {print "no training: " v[0] " -> " v[n-1]; exit 1}}' ||
    fail "$name: the loss did not fall"
}
libdir=$(pkg-config --variable=libdir loom)
shared=(-Wl,-rpath,"$libdir" $(pkg-config --cflags --libs loom))
build_run ddp "$work/first.c" 2 "${shared[@]}"
ldd "$work/ddp" | grep -q "libloom.so.* => $prefix/lib" || fail "ddp does not run with the installed libloom.so"
build_run fsdp "$work/fsdp.c" 2 "${shared[@]}"
build_run none "$work/none.c" 1 "${shared[@]}"
build_run static "$work/first.c" 2 $(pkg-config --cflags --libs loom-static)
if ldd "$work/static" | grep -q libloom; then fail "the static build links libloom.so"; fi
echo "readme_program: ok ($lines lines)"
