#!/usr/bin/env bash
# install_check.sh: loom as other projects use it. Installs the build tree into a fresh prefix
# (cmake --install), then, against that prefix only:
#   - a CMake project (tests/tools/consumer) builds the examples with find_package(loom), linked
#     to loom::loom (libloom.so) and loom::loom_static, and the demo runs from both;
#   - the examples build with `cc $(pkg-config --cflags --libs loom)`, and the demo runs;
#   - a C++ file that includes every public header compiles with g++ -Wall -Wextra -Werror;
#   - libloom.so exports loom_* only (nm -D), and every public header's functions are among them.
# Usage: install_check.sh SOURCE_DIR BUILD_DIR
set -eu
src=$1 build=$2
work=$(mktemp -d /tmp/loom-install-XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
fail() { echo "install_check: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >/dev/null || fail "cmake --install failed"
for f in include/loom/loom.h lib/libloom.so lib/libloom.a bin/loom lib/pkgconfig/loom.pc \
         lib/pkgconfig/loom-static.pc lib/cmake/loom/loomConfig.cmake; do
  [ -e "$prefix/$f" ] || fail "$f was not installed"
done
export LD_LIBRARY_PATH=$prefix/lib

# 1. CMake package
cmake -S "$src/tests/tools/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
      -DLOOM_EXAMPLES="$src/examples" >/dev/null || fail "find_package(loom) project: configure failed"
cmake --build "$work/consumer" -j2 >/dev/null || fail "find_package(loom) project: build failed"
for demo in demo demo_static; do
  out=$("$work/consumer/$demo") || fail "$demo (find_package) failed"
  grep -q "a bad call gives a status and a message: LOOM_EINVAL" <<<"$out" || fail "$demo: unexpected output"
done
ldd "$work/consumer/demo" | grep -q "$prefix/lib/libloom.so" || fail "demo does not use the installed libloom.so"

# 2. pkg-config
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
for ex in demo train_mlp; do
  cc -Wall -Werror -o "$work/pc_$ex" "$src/examples/$ex.c" $(pkg-config --cflags --libs loom) ||
    fail "cc \$(pkg-config --cflags --libs loom) $ex.c failed"
done
"$work/pc_demo" | grep -q "LOOM_EINVAL" || fail "pkg-config demo failed"

# 3. every public header from C++
{
  for h in "$prefix"/include/loom/*.h; do echo "#include <loom/$(basename "$h")>"; done
  echo 'int main() { return loom_strerror(LOOM_OK) == nullptr; }'
} > "$work/all.cpp"
g++ -std=c++17 -Wall -Wextra -Werror -I"$prefix/include" -c "$work/all.cpp" -o "$work/all.o" ||
  fail "the public headers do not compile as C++ with -Wall -Wextra -Werror"

# 4. exported symbols: loom_* only, and the API is there
nm -D --defined-only "$prefix/lib/libloom.so" | awk '{print $3}' | sort > "$work/exported"
others=$(grep -v '^loom_[a-z0-9]' "$work/exported" || true)
[ -z "$others" ] || fail "libloom.so exports more than loom_*: $(echo $others | head -c 300)"
grep -ho '\bloom_[a-z0-9_]*(' "$prefix"/include/loom/*.h | tr -d '(' | sort -u > "$work/called"
grep -ho '#define loom_[a-z0-9_]*(' "$prefix"/include/loom/*.h | sed 's/#define //; s/(//' |
  sort -u > "$work/macros"   # function-like macros are not symbols
comm -23 "$work/called" "$work/macros" > "$work/declared"
missing=$(comm -23 "$work/declared" "$work/exported" || true)
[ -z "$missing" ] || fail "declared in the headers but not exported: $(echo $missing | head -c 300)"
echo "install_check: ok ($(wc -l < "$work/exported") symbols exported, all loom_*)"
